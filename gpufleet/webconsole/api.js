// The public API (/v1), every request SigV4-signed with the caller's own credentials.
// Errors: RFC 9457 problems become ApiError (status, title, detail).
import { canonicalQuery, sign } from "./sigv4.js";

// sessionStorage key of credentials signed in with on the sign-in page (they replace the served ones)
const SIGNED_IN = "gpufleet.console.signedIn";

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

// gpufleet/status.py: the statuses a job can be in, and those it does not leave on its own
export const ENDED = ["SUCCEEDED", "FAILED", "BLOCKED", "QUARANTINED", "CANCELLED", "EXPIRED", "REJECTED"];
export const STATUSES = ["QUEUED", "PENDING", "SCHEDULED", "RUNNING", "FINALIZING", ...ENDED];

export class Api {
  // config: {region, service, credentials: {access_key_id, secret_access_key, session_token?}, identity}
  constructor(config, base = "") {
    this.config = config;
    this.base = base;
  }

  static async load() {
    const resp = await fetch("/console/config.json", { credentials: "same-origin", cache: "no-store" });
    if (!resp.ok) throw new ApiError(resp.status, { title: "The console has no credentials" });
    const api = new Api(await resp.json());
    const saved = sessionStorage.getItem(SIGNED_IN);
    if (saved) Object.assign(api.config, JSON.parse(saved));
    return api;
  }

  // Sign in with other credentials (e.g. an operator's access key): kept in this tab's sessionStorage until
  // signed out. Whether they carry the admin policy is asked of the API itself (GET /v1/admin/tenants):
  // the admin pages are shown only when it answers 200.
  async signIn(credentials) {
    const previous = { ...this.config };
    this.config = { ...this.config, credentials, identity: `access key ${credentials.access_key_id}`, admin: false };
    try {
      await this.request("GET", "/v1/admin/tenants");
      this.config.admin = true;
    } catch (err) {
      if (err.status !== 403) {
        this.config = previous;
        throw err;
      }
    }
    const { identity, admin } = this.config;
    sessionStorage.setItem(SIGNED_IN, JSON.stringify({ credentials, identity, admin }));
    return this.config.admin;
  }

  signOut() {
    sessionStorage.removeItem(SIGNED_IN);
  }

  get isAdmin() { return Boolean(this.config.admin); }

  // query: [[key, value], ...] (repeat a key for several values); body: an object sent as JSON
  async request(method, path, { query = [], body, headers = {} } = {}) {
    const text = body === undefined ? "" : JSON.stringify(body);
    const qs = canonicalQuery(query.filter(([, v]) => v !== undefined && v !== null && v !== ""));
    const signed = await sign({
      method, host: location.host, path, query: qs, body: text,
      credentials: this.config.credentials, region: this.config.region, service: this.config.service,
    });
    const init = { method, headers: { ...headers, ...signed }, credentials: "omit", cache: "no-store" };
    if (body !== undefined) {
      init.body = text;
      init.headers["content-type"] = "application/json";
    }
    const resp = await fetch(this.base + path + (qs ? "?" + qs : ""), init);
    const type = resp.headers.get("content-type") || "";
    const data = type.includes("json") ? await resp.json() : await resp.text();
    if (!resp.ok) throw new ApiError(resp.status, typeof data === "object" ? data : { detail: String(data) });
    return data;
  }

  listJobs({ statuses = [], labels = [], mine = false, user, arrayId, limit = 50, cursor } = {}) {
    const query = [["limit", limit], ["cursor", cursor], ["array_id", arrayId], ["user", user]];
    for (const s of statuses) query.push(["status", s]);
    for (const l of labels) query.push(["label", l]);
    if (mine) query.push(["mine", "true"]);
    return this.request("GET", "/v1/jobs", { query });
  }
  getJob(id) { return this.request("GET", `/v1/jobs/${encodeURIComponent(id)}`); }
  events(id) { return this.request("GET", `/v1/jobs/${encodeURIComponent(id)}/events`); }
  logs(id, after) { return this.request("GET", `/v1/jobs/${encodeURIComponent(id)}/logs`, { query: [["after", after]] }); }
  output(id) { return this.request("GET", `/v1/jobs/${encodeURIComponent(id)}/output`); }
  cancel(id) { return this.request("DELETE", `/v1/jobs/${encodeURIComponent(id)}`); }
  retry(id) {
    return this.request("POST", `/v1/jobs/${encodeURIComponent(id)}/retry`, {
      headers: { "idempotency-key": crypto.randomUUID() },
    });
  }
  submit(spec, key) {
    return this.request("POST", "/v1/jobs", { body: spec, headers: { "idempotency-key": key } });
  }
  pools() { return this.request("GET", "/v1/pools"); }
  quota() { return this.request("GET", "/v1/quota"); }

  // operators (the admin policy): the GPU-time attribution with the per-GPU lanes and the nodes now
  diagnose({ since, until, pool } = {}) {
    return this.request("GET", "/v1/admin/diagnose", {
      query: [["since", since], ["until", until], ["pool", pool], ["lanes", "true"], ["fleet", "true"]],
    });
  }
  admin(path, { method = "GET", query = [], body } = {}) {
    return this.request(method, `/v1/admin/${path}`, { query, body });
  }
}
