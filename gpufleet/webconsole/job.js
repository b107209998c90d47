// One job: status, spec, timeline, attempts, phase timings, logs (followed), billing and its output:
// for a video job, an in-page player and the provenance the platform recorded for it.
import { ENDED } from "./api.js";
import { cancelButton } from "./jobs.js";
import { h, keyValues, progressOf, showError, statusBadge, when } from "./ui.js";

function section(title, id, ...content) {
  return h("section", { "aria-labelledby": id }, h("h2", { id }, title), ...content);
}

function summary(job) {
  const place = job.placement || {};
  const rows = {
    Owner: job.owner,
    Submitted: job.created_at,
    Updated: job.updated_at,
    Priority: job.priority,
    Attempts: job.attempt_count,
    Preemptions: job.preemptions,
    Pool: place.pool,
    Node: place.node,
    "Retry of": job.retry_of,
    "Array": job.array_id ? `${job.array_id} [${job.array_index}]` : undefined,
  };
  if (job.scheduling) rows["Why it waits"] = job.scheduling.reason;
  if (job.queue) {
    rows["Queue position"] = `${job.queue.position} of ${job.queue.pending}`;
    rows["Estimated start"] = job.queue.estimated_start || "unknown";
  }
  return keyValues(Object.fromEntries(Object.entries(rows).filter(([, v]) => v !== undefined && v !== null && v !== "")));
}

// A gang's members in its current attempt (GET /v1/jobs/{id} members: node, rank, GPUs, state), rank order.
function members(job) {
  if (!job.members || !job.members.length) return "";
  return h("table", { class: "members" },
    h("caption", {}, "Members of the current attempt (a gang)"),
    h("thead", {}, h("tr", {}, ["Rank", "Node", "GPUs", "State"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, job.members.map((m) => h("tr", {},
      h("th", { scope: "row" }, String(m.rank)), h("td", {}, m.node), h("td", {}, m.gpus.join(", ")),
      h("td", {}, m.state)))));
}

// Attempts as the timeline tells them: events grouped by the fencing epoch they carry.
function attempts(events) {
  const by = new Map();
  for (const e of events) {
    const epoch = e.detail && e.detail.epoch;
    if (epoch === undefined || epoch === null) continue;
    if (!by.has(epoch)) by.set(epoch, []);
    by.get(epoch).push(e);
  }
  if (!by.size) return h("p", { class: "muted" }, "No attempt yet.");
  return h("table", { class: "attempts" },
    h("caption", {}, "Attempts (one per fencing epoch)"),
    h("thead", {}, h("tr", {}, ["Epoch", "Started", "Last event", "Where"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, [...by.entries()].map(([epoch, evs]) => {
      const d = Object.assign({}, ...evs.map((e) => e.detail || {}));
      return h("tr", {}, h("th", { scope: "row" }, String(epoch)), h("td", {}, when(evs[0].ts)),
        h("td", {}, evs[evs.length - 1].type), h("td", {}, [d.pool, d.node || (d.nodes || []).join(", ") || d.target].filter(Boolean).join(" / ")));
    })));
}

function timeline(events) {
  if (!events.length) return h("p", { class: "muted" }, "No events yet.");
  return h("ol", { class: "timeline" }, events.map((e) => h("li", {},
    when(e.ts), " ", h("strong", {}, e.type),
    Object.keys(e.detail || {}).length ? h("span", { class: "detail" }, " ", JSON.stringify(e.detail)) : null)));
}

function phases(job) {
  const run = job.last_run;
  const durations = run && run.phases && run.phases.durations;
  if (!durations) return h("p", { class: "muted" }, "No finished run yet.");
  return h("table", { class: "phases" },
    h("caption", {}, `Phase timings of epoch ${run.epoch} (${run.gpu_seconds ?? "?"} GPU-seconds)`),
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Phase"), h("th", { scope: "col" }, "Seconds"))),
    h("tbody", {}, Object.entries(durations).map(([p, s]) =>
      h("tr", {}, h("th", { scope: "row" }, p), h("td", {}, Number(s).toFixed(2))))));
}

async function outputPart(api, job) {
  if (job.status !== "SUCCEEDED") return h("p", { class: "muted" }, "Output is available once the job has succeeded.");
  const out = await api.output(job.job_id);
  if (out.kind === "files") {
    return h("ul", { class: "files" }, out.files.map((f) =>
      h("li", {}, h("a", { href: f.url, rel: "noreferrer" }, f.path), ` (${f.bytes} bytes)`)));
  }
  const rec = job.output || {};
  const video = h("video", {
    id: "player", controls: true, muted: true, playsInline: true, preload: "auto", src: out.video_url,
    "aria-label": `Generated video of job ${job.job_id}`,
  });
  video.muted = true;
  const signed = Boolean(out.manifest_url);
  const verdict = h("div", { class: "provenance", id: "provenance", role: "status" },
    h("p", {}, h("strong", {}, signed ? "✓ C2PA-signed" : "✗ No C2PA manifest"),
      signed ? " — the platform signed this video's C2PA manifest when it delivered it" : ""),
    h("p", {}, rec.watermark_payload || out.watermark_payload
      ? `✓ Watermarked: payload ${out.watermark_payload || rec.watermark_payload}` +
        (rec.watermark_key_id ? ` (key ${rec.watermark_key_id})` : "")
      : "✗ No watermark recorded"),
    keyValues(Object.fromEntries(Object.entries({
      "Video SHA-256": rec.video_sha256,
      "Links valid until": out.expires_at,
    }).filter(([, v]) => v))),
    h("p", {},
      h("a", { href: out.video_url, rel: "noreferrer", download: `${job.job_id}.mp4` }, "Download the video"),
      signed ? [" · ", h("a", { href: out.manifest_url, rel: "noreferrer", download: `${job.job_id}.c2pa` },
        "Download the C2PA manifest")] : null));
  return h("div", {}, h("figure", {}, video, h("figcaption", {}, (job.spec.workload || {}).prompt || "")), verdict);
}

export async function jobView(api, main, params, ctx, jobId) {
  const head = h("div", { class: "jobhead" });
  const summaryBox = h("div", {});
  const timelineBox = h("div", {});
  const attemptsBox = h("div", {});
  const phasesBox = h("div", {});
  const billingBox = h("div", {});
  const outputBox = h("div", { "aria-live": "polite" });
  const logBox = h("pre", { class: "logs", role: "log", tabindex: "0", "aria-label": "Log lines" });
  let job = await api.getJob(jobId);
  main.append(
    h("h1", { tabindex: "-1" }, "Job ", h("code", {}, jobId)),
    head,
    section("Summary", "s-summary", summaryBox),
    section("Output", "s-output", outputBox),
    section("Timeline", "s-timeline", timelineBox),
    section("Attempts", "s-attempts", attemptsBox),
    section("Phase timings", "s-phases", phasesBox),
    section("Logs", "s-logs", logBox),
    section("Billing", "s-billing", billingBox),
    section("Spec", "s-spec", h("pre", { class: "spec", tabindex: "0", "aria-label": "Job spec (JSON)" },
      JSON.stringify(job.spec, null, 2))));
  let logAfter;
  let outputShown = false;
  const refresh = async () => {
    job = await api.getJob(jobId);
    const actions = [cancelButton(api, job, refresh)];
    if (ENDED.includes(job.status)) {
      actions.push(h("button", { type: "button", onclick: async () => {
        try {
          const again = await api.retry(jobId);
          location.hash = `#/jobs/${again.job_id}`;
        } catch (err) {
          showError(err);
        }
      } }, "Retry as a new job"));
    }
    head.replaceChildren(h("p", { class: "statusline", "aria-live": "polite" }, "Status: ", statusBadge(job.status), " ",
      progressOf(job)), h("p", { class: "actions" }, actions));
    summaryBox.replaceChildren(summary(job));
    const evs = (await api.events(jobId)).events;
    timelineBox.replaceChildren(timeline(evs));
    attemptsBox.replaceChildren(members(job), attempts(evs));
    phasesBox.replaceChildren(phases(job));
    billingBox.replaceChildren(keyValues(job.billing));
    for (let i = 0; i < 5; i++) {  // follow the logs: read pages until no new chunk
      const page = await api.logs(jobId, logAfter);
      for (const l of page.lines) logBox.append(`${l.ts || ""} ${l.level || ""} ${l.msg}\n`);
      if (!page.next || page.next === logAfter) break;
      logAfter = page.next;
    }
    if (!outputShown && (job.status === "SUCCEEDED" || ENDED.includes(job.status))) {
      outputShown = true;
      outputBox.replaceChildren(await outputPart(api, job).catch((err) => { showError(err); return ""; }));
    } else if (!outputShown) {
      outputBox.replaceChildren(h("p", { class: "muted" }, "Output is available once the job has succeeded."));
    }
    return ENDED.includes(job.status);
  };
  await refresh();
  ctx.every(1500, refresh);
}
