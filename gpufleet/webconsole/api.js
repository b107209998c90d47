// The public API (/v1), every request SigV4-signed with the caller's own credentials.
// Errors: RFC 9457 problems become ApiError (status, title, detail).
import {
  authorizeUrl, challengeOf, exchangeCode, identityCredentials, nameOf, needsRefresh, newVerifier, parseCallback,
  refreshTokens, signingTarget, usesHostedUi,
} from "./signin_flow.js";
import { canonicalQuery, sign } from "./sigv4.js";

// sessionStorage key of credentials signed in with on the sign-in page (they replace the served ones)
const SIGNED_IN = "gpufleet.console.signedIn";
// sessionStorage keys of the hosted UI's sign-in: the pending request (state, verifier) and the tokens
const PENDING = "gpufleet.console.pkce";
const TOKENS = "gpufleet.console.tokens";

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
    if (api.hostedUi) {
      await api.finishHostedSignIn();
      return api;
    }
    const saved = sessionStorage.getItem(SIGNED_IN);
    if (saved) Object.assign(api.config, JSON.parse(saved));
    return api;
  }

  // served by the AWS deployment: sign in through the Cognito hosted UI (signin_flow.js)
  get hostedUi() { return usesHostedUi(this.config); }

  get redirectUri() { return `${location.origin}/`; }

  // Start the hosted UI's code flow: a fresh verifier and state kept in this tab, then off to the hosted UI.
  async startHostedSignIn() {
    const verifier = newVerifier();
    const state = newVerifier().slice(0, 32);
    sessionStorage.setItem(PENDING, JSON.stringify({ verifier, state, hash: location.hash }));
    location.assign(authorizeUrl(this.config, { state, challenge: await challengeOf(verifier), redirectUri: this.redirectUri }));
  }

  // Back from the hosted UI (?code=&state=): exchange the code with the tab's verifier, then get credentials; or
  // take up the tokens this tab already holds. The query is removed from the address bar either way.
  async finishHostedSignIn() {
    const pending = JSON.parse(sessionStorage.getItem(PENDING) || "null");
    const answer = parseCallback(location.search, pending && pending.state);
    if (answer) {
      sessionStorage.removeItem(PENDING);
      history.replaceState(null, "", location.pathname + ((pending && pending.hash) || "#/jobs"));
      if (answer.error) throw new ApiError(401, { title: "Sign-in failed", detail: answer.error });
      const tokens = await exchangeCode(this.config, { code: answer.code, verifier: pending.verifier, redirectUri: this.redirectUri });
      sessionStorage.setItem(TOKENS, JSON.stringify(tokens));
    }
    const tokens = JSON.parse(sessionStorage.getItem(TOKENS) || "null");
    if (!tokens) return;
    this.config.identity = nameOf(tokens.id_token);
    await this.ensureCredentials();
    await this.probeAdmin();
  }

  // Credentials from the identity pool, renewed (with fresh tokens when the id token expired) before they expire.
  async ensureCredentials() {
    if (!this.hostedUi || !needsRefresh(this.config.credentials)) return;
    let tokens = JSON.parse(sessionStorage.getItem(TOKENS) || "null");
    if (!tokens) throw new ApiError(401, { title: "Not signed in", detail: "Sign in on the Sign in page." });
    if (!this.refreshing) {
      this.refreshing = (async () => {
        try {
          try {
            this.config.credentials = await identityCredentials(this.config, tokens.id_token);
          } catch (err) {  // the id token expired (an hour): new tokens from the refresh token, then again
            if (!tokens.refresh_token) throw err;
            tokens = { ...tokens, ...(await refreshTokens(this.config, tokens.refresh_token)) };
            sessionStorage.setItem(TOKENS, JSON.stringify(tokens));
            this.config.credentials = await identityCredentials(this.config, tokens.id_token);
          }
        } finally {
          this.refreshing = null;
        }
      })();
    }
    await this.refreshing;
  }

  async probeAdmin() {
    try {
      await this.request("GET", "/v1/admin/tenants");
      this.config.admin = true;
    } catch (err) {
      if (err.status !== 403) throw err;
      this.config.admin = false;
    }
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
    if (this.hostedUi) {  // forget the tokens, then end the hosted UI's session too
      sessionStorage.removeItem(TOKENS);
      const q = new URLSearchParams({ client_id: this.config.user_pool_client_id, logout_uri: this.redirectUri });
      location.assign(`${this.config.hosted_ui}/logout?${q}`);
    }
  }

  get isAdmin() { return Boolean(this.config.admin); }

  // query: [[key, value], ...] (repeat a key for several values); body: an object sent as JSON
  async request(method, path, { query = [], body, headers = {} } = {}) {
    const text = body === undefined ? "" : JSON.stringify(body);
    const qs = canonicalQuery(query.filter(([, v]) => v !== undefined && v !== null && v !== ""));
    await this.ensureCredentials();
    if (!this.config.credentials) throw new ApiError(401, { title: "Not signed in", detail: "Sign in on the Sign in page." });
    // in AWS the execute-api host and the path under its stage; locally the page's own host
    const target = signingTarget(this.config.api_url, path, location.host);
    const signed = await sign({
      method, host: target.host, path: target.path, query: qs, body: text,
      credentials: this.config.credentials, region: this.config.region, service: this.config.service,
    });
    const init = { method, headers: { ...headers, ...signed }, credentials: "omit", cache: "no-store" };
    if (body !== undefined) {
      init.body = text;
      init.headers["content-type"] = "application/json";
    }
    const resp = await fetch((this.config.api_url ? target.url : this.base + path) + (qs ? "?" + qs : ""), init);
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
