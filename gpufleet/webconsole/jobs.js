// Jobs: the tenant's jobs, newest first, filtered by status, label, array and owner; live status and progress;
// cancel an unfinished job, retry an ended one.
import { ENDED, STATUSES } from "./api.js";
import { describeSpec, h, progressOf, showError, statusBadge, when } from "./ui.js";

export function filtersFrom(params) {
  return {
    statuses: params.getAll("status"),
    labels: params.getAll("label"),
    mine: params.get("mine") === "true",
    user: params.get("user") || undefined,
    arrayId: params.get("array_id") || undefined,
  };
}

function filterForm(f) {
  const onsubmit = (ev) => {
    ev.preventDefault();
    const data = new FormData(ev.target);
    const q = new URLSearchParams();
    if (data.get("status")) q.append("status", data.get("status"));
    for (const l of String(data.get("label") || "").split(",").map((s) => s.trim()).filter(Boolean)) q.append("label", l);
    if (data.get("mine")) q.append("mine", "true");
    else if (String(data.get("user") || "").trim()) q.append("user", String(data.get("user")).trim());
    if (data.get("array_id")) q.append("array_id", String(data.get("array_id")).trim());
    location.hash = "#/jobs" + (q.toString() ? "?" + q : "");
  };
  return h("form", { class: "filters", role: "search", "aria-label": "Filter jobs", onsubmit },
    h("label", { for: "f-status" }, "Status"),
    h("select", { id: "f-status", name: "status" },
      h("option", { value: "" }, "any"),
      STATUSES.map((s) => h("option", { value: s, selected: f.statuses.includes(s) }, s))),
    h("label", { for: "f-label" }, "Label (key=value, comma-separated)"),
    h("input", { id: "f-label", name: "label", type: "text", value: f.labels.join(", "), placeholder: "team=vision" }),
    h("label", { for: "f-array" }, "Array id"),
    h("input", { id: "f-array", name: "array_id", type: "text", value: f.arrayId || "", size: 16 }),
    h("label", { for: "f-user" }, "User"),
    h("input", { id: "f-user", name: "user", type: "text", value: f.user || "", size: 12 }),
    h("label", { class: "check" },
      h("input", { type: "checkbox", name: "mine", value: "true", checked: f.mine }), " only my jobs"),
    h("button", { type: "submit" }, "Apply filters"));
}

export function cancelButton(api, job, after) {
  if (ENDED.includes(job.status) || job.cancel_requested) return job.cancel_requested && !ENDED.includes(job.status)
    ? h("span", { class: "muted" }, "cancelling…") : null;
  return h("button", {
    type: "button", class: "danger", id: `cancel-${job.job_id}`, "aria-label": `Cancel job ${job.job_id}`,
    onclick: async (ev) => {
      ev.target.disabled = true;
      try {
        await api.cancel(job.job_id);
      } catch (err) {
        if (err.status !== 409) showError(err);  // 409: it ended meanwhile, the refresh shows how
      }
      await after().catch(showError);
    },
  }, "Cancel");
}

// An ended job is submitted again as a new job (POST /v1/jobs/{id}/retry), whose page then opens.
export function retryButton(api, job) {
  if (!ENDED.includes(job.status)) return null;
  return h("button", {
    type: "button", id: `retry-${job.job_id}`, "aria-label": `Retry job ${job.job_id} as a new job`,
    onclick: async (ev) => {
      ev.target.disabled = true;
      try {
        const again = await api.retry(job.job_id);
        location.hash = `#/jobs/${again.job_id}`;
      } catch (err) {
        showError(err);
        ev.target.disabled = false;
      }
    },
  }, "Retry");
}

function row(api, job, refresh) {
  const place = job.placement || {};
  return h("tr", { "data-job": job.job_id },
    h("th", { scope: "row" }, h("a", { href: `#/jobs/${job.job_id}` }, job.job_id)),
    h("td", {}, statusBadge(job.status)),
    h("td", { class: "workload" }, describeSpec(job.spec)),
    h("td", {}, progressOf(job)),
    h("td", {}, [place.pool, place.node].filter(Boolean).join(" / ")),
    h("td", {}, Object.entries((job.spec && job.spec.labels) || {}).map(([k, v]) => `${k}=${v}`).join(", ")),
    h("td", {}, when(job.created_at)),
    h("td", {}, cancelButton(api, job, refresh), retryButton(api, job)));
}

export async function jobsView(api, main, params, ctx) {
  const f = filtersFrom(params);
  const body = h("tbody", {});
  const summary = h("p", { class: "muted", "aria-live": "polite" });
  main.append(
    h("h1", { tabindex: "-1" }, "Jobs"),
    filterForm(f),
    summary,
    h("table", { class: "jobs" },
      h("caption", {}, "Jobs, newest first (updates every few seconds)"),
      h("thead", {}, h("tr", {}, ["Job", "Status", "Workload", "Progress", "Pool / node", "Labels", "Submitted", "Actions"]
        .map((c) => h("th", { scope: "col" }, c)))),
      body));
  const refresh = async () => {
    const page = await api.listJobs({ ...f, limit: 50 });
    const focused = document.activeElement && document.activeElement.id;
    body.replaceChildren(...page.jobs.map((j) => row(api, j, refresh)));
    if (!page.jobs.length) body.append(h("tr", {}, h("td", { colspan: 8 }, "No jobs match.")));
    const counted = summary.textContent;
    const text = `${page.jobs.length} job(s) shown${page.next_cursor ? " (more exist: narrow the filters)" : ""}.`;
    if (counted !== text) summary.textContent = text;
    if (focused && document.getElementById(focused)) document.getElementById(focused).focus();
  };
  await refresh();
  ctx.every(1500, refresh);
}
