// Queue: jobs waiting to be placed, in the scheduler's order, each with its reason and estimated start;
// and the pools' capacity.
import { describeSpec, h, statusBadge, when } from "./ui.js";

const MAX_DETAILED = 25;

function order(a, b) {
  const pa = a.queue ? a.queue.position : Infinity;
  const pb = b.queue ? b.queue.position : Infinity;
  return pa - pb || String(a.created_at).localeCompare(String(b.created_at));
}

function waitRow(job) {
  const q = job.queue;
  const s = job.scheduling;
  return h("tr", { "data-job": job.job_id },
    h("td", {}, q ? `${q.position} of ${q.pending}` : "—"),
    h("th", { scope: "row" }, h("a", { href: `#/jobs/${job.job_id}` }, job.job_id)),
    h("td", {}, statusBadge(job.status)),
    h("td", { class: "workload" }, describeSpec(job.spec)),
    h("td", { class: "reason" }, s ? s.reason : job.status === "QUEUED" ? "not yet seen by the scheduler" : "—"),
    h("td", {}, s && s.retry_at ? when(s.retry_at) : ""),
    h("td", {}, q && q.estimated_start ? when(q.estimated_start) : "unknown"),
    h("td", {}, when(job.created_at)));
}

function poolRow(p) {
  const c = p.capacity || {};
  return h("tr", {},
    h("th", { scope: "row" }, p.name),
    h("td", {}, p.kind),
    h("td", {}, p.gpu_type),
    h("td", {}, `${c.gpus_free} free of ${c.gpus_total}`),
    h("td", {}, c.gpus_total ? `${Math.round((100 * (c.gpus_total - c.gpus_free)) / c.gpus_total)}%` : "—"),
    h("td", {}, c.nodes ?? ""),
    h("td", {}, `$${p.price_per_gpu_hour}/GPU-hour`));
}

// milli-GPUs per GPU type ("*": any type) -> "any: 4 GPUs, A100: 1 GPU"
function gpus(byType) {
  const parts = Object.entries(byType || {}).map(([t, m]) => `${t === "*" || t === "all" ? "any" : t}: ${m / 1000} GPU${m === 1000 ? "" : "s"}`);
  return parts.length ? parts.join(", ") : "—";
}

function quotaRow(level) {
  return h("tr", {},
    h("th", { scope: "row" }, level.level),
    h("td", {}, level.path),
    h("td", {}, level.configured ? gpus(level.limits) : "no limit"),
    h("td", {}, level.configured ? gpus(level.guarantee) : ""),
    h("td", {}, gpus(level.usage)));
}

export async function queueView(api, main, params, ctx) {
  const waiting = h("tbody", {});
  const pools = h("tbody", {});
  const quota = h("tbody", {});
  const queued = h("p", {});
  main.append(
    h("h1", { tabindex: "-1" }, "Queue"),
    h("table", { class: "queue" },
      h("caption", {}, "Waiting jobs in scheduling order, with the scheduler's reason"),
      h("thead", {}, h("tr", {}, ["Position", "Job", "Status", "Workload", "Why it waits", "Tried again at",
        "Estimated start", "Submitted"].map((c) => h("th", { scope: "col" }, c)))),
      waiting),
    h("h2", {}, "Your quota"),
    h("table", { class: "quota" },
      h("caption", {}, "GPUs you may use, by level (a job waits when any level is full)"),
      h("thead", {}, h("tr", {}, ["Level", "Path", "Limit", "Guaranteed", "In use"]
        .map((c) => h("th", { scope: "col" }, c)))),
      quota),
    queued,
    h("h2", {}, "Pools"),
    h("table", { class: "pools" },
      h("caption", {}, "Capacity and utilisation by pool, now"),
      h("thead", {}, h("tr", {}, ["Pool", "Kind", "GPU type", "GPUs", "In use", "Nodes", "Price"]
        .map((c) => h("th", { scope: "col" }, c)))),
      pools));
  const refresh = async () => {
    const [page, pl, q] = await Promise.all([
      api.listJobs({ statuses: ["QUEUED", "PENDING"], limit: 100 }), api.pools(), api.quota()]);
    // the list does not carry queue positions: GET each PENDING job (the first MAX_DETAILED) for its place
    const detailed = await Promise.all(page.jobs.map((j, i) =>
      j.status === "PENDING" && i < MAX_DETAILED ? api.getJob(j.job_id).catch(() => j) : j));
    const jobs = detailed.sort(order);
    waiting.replaceChildren(...jobs.map(waitRow));
    if (!jobs.length) waiting.append(h("tr", {}, h("td", { colspan: 8 }, "Nothing is waiting.")));
    pools.replaceChildren(...pl.pools.map(poolRow));
    quota.replaceChildren(...q.levels.map(quotaRow));
    queued.textContent = `Jobs not yet running: yours ${q.queued.user} of at most ${q.queued.user_limit}, ` +
      `your team's ${q.queued.team} of at most ${q.queued.team_limit}.`;
  };
  await refresh();
  ctx.every(2000, refresh);
}
