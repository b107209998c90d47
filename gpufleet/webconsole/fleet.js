// Fleet (operators): the nodes now (state, GPUs, resident models) and a per-GPU timeline of the last hours,
// every GPU-second given to one cause (GET /v1/admin/diagnose?lanes=true&fleet=true). The timeline reads
// without colour: each segment carries its cause's code and a pattern, and a table gives the same as text.
import { CAUSES, causeInfo, duration, laneShares, mergeSegments } from "./timeline.js";
import { h, when } from "./ui.js";

const WINDOWS = [0.25, 1, 3, 6, 12, 24];  // hours
const STATE_SYMBOL = { ready: "✓", draining: "◐", lost: "✗" };

function stateBadge(state) {
  return h("span", { class: `status node-${state}`, "data-state": state },
    h("span", { "aria-hidden": "true" }, STATE_SYMBOL[state] || "•"), " ", state);
}

function list(items) {
  return items && items.length ? items.join(", ") : h("span", { class: "muted" }, "none");
}

function nodeRow(n) {
  const free = n.gpus.reduce((acc, g) => acc + g.milli_free, 0) / 1000;
  return h("tr", { "data-node": n.node_id },
    h("th", { scope: "row" }, n.node_id),
    h("td", {}, n.pool),
    h("td", {}, stateBadge(n.state)),
    h("td", {}, `${n.gpus.length} × ${n.gpu_type}`),
    h("td", {}, `${free} of ${n.gpus.length}`),
    h("td", {}, list(n.resident_models)),
    h("td", {}, list(n.cached_models)),
    h("td", {}, String(n.running_jobs)),
    h("td", {}, n.heartbeat_at ? when(n.heartbeat_at) : "never"));
}

function pct(x) {
  return `${(100 * x).toFixed(x < 0.1 ? 1 : 0)}%`;
}

function lane(l, start, end) {
  const segs = mergeSegments(l.segments, start, end);
  const shares = laneShares(l.segments, start, end);
  const name = `${l.node} GPU ${l.gpu}`;
  const summary = shares.map((s) => `${causeInfo(s.cause).label} ${pct(s.share)}`).join(", ");
  const bar = h("div", { class: "lane-bar", role: "img", "aria-label": `${name}: ${summary}` },
    segs.map((s) => {
      const info = causeInfo(s.cause);
      const el = h("span", {
        class: `seg cause-${s.cause}`, "data-cause": s.cause,
        title: `${info.label}: ${duration(s.end - s.start)}${s.job ? ` (${s.job})` : ""}`,
      }, info.code);
      el.style.width = `${(100 * (s.end - s.start)) / (end - start)}%`;  // CSSOM, allowed by the CSP
      return el;
    }));
  return h("li", { class: "lane", "data-lane": name }, h("span", { class: "lane-name" }, name), bar);
}

function axis(start, end) {
  const fmt = (t) => new Date(t * 1000).toLocaleTimeString(undefined, { hour12: false, hour: "2-digit", minute: "2-digit" });
  return h("p", { class: "axis", "aria-hidden": "true" }, h("span", {}, fmt(start)), h("span", {}, fmt(end)));
}

function legend() {
  return h("ul", { class: "legend", "aria-label": "Timeline legend" },
    CAUSES.map((c) => h("li", {}, h("span", { class: `seg swatch cause-${c.cause}`, "aria-hidden": "true" }, c.code),
      " ", `${c.code} = ${c.label}`)));
}

function sharesRow(l, start, end) {
  const shares = laneShares(l.segments, start, end);
  return h("tr", { "data-lane": `${l.node} GPU ${l.gpu}` },
    h("th", { scope: "row" }, `${l.node} GPU ${l.gpu}`),
    h("td", {}, l.pool),
    h("td", {}, shares.map((s) => `${causeInfo(s.cause).label}: ${duration(s.seconds)} (${pct(s.share)})`).join("; ")));
}

export async function fleetView(api, main, params, ctx) {
  const hours = WINDOWS.includes(Number(params.get("hours"))) ? Number(params.get("hours")) : 1;
  const span = (n) => (n < 1 ? `${n * 60} min` : `${n} h`);
  const pool = params.get("pool") || "";
  const onsubmit = (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(ev.target).entries()) if (v) q.append(k, v);
    location.hash = "#/fleet?" + q;
  };
  const nodes = h("tbody", {});
  const lanes = h("ol", { class: "lanes" });
  const shares = h("tbody", {});
  const causes = h("tbody", {});
  const head = h("p", {});
  const range = h("div", {});
  main.append(
    h("h1", { tabindex: "-1" }, "Fleet"),
    h("form", { class: "filters", "aria-label": "Fleet window and pool", onsubmit },
      h("label", { for: "fl-hours" }, "Last"),
      h("select", { id: "fl-hours", name: "hours" }, WINDOWS.map((n) => h("option", { value: n, selected: n === hours }, span(n)))),
      h("label", { for: "fl-pool" }, "Pool (empty: all)"),
      h("input", { id: "fl-pool", name: "pool", type: "text", value: pool, size: 14 }),
      h("button", { type: "submit" }, "Show")),
    head,
    h("table", { class: "nodes" },
      h("caption", {}, "Nodes now"),
      h("thead", {}, h("tr", {}, ["Node", "Pool", "State", "GPUs", "Free GPUs", "Resident models", "Cached models",
        "Running jobs", "Last heartbeat"].map((c) => h("th", { scope: "col" }, c)))),
      nodes),
    h("h2", { id: "timeline-h" }, `GPU timeline, last ${span(hours)}`),
    h("p", { class: "hint" }, "Each GPU's time by cause; each segment shows its cause's code (legend below). " +
      "The table after it says the same in words."),
    range,
    lanes,
    legend(),
    h("table", { class: "lane-shares" },
      h("caption", {}, "Each GPU's time by cause (the timeline as text)"),
      h("thead", {}, h("tr", {}, ["GPU", "Pool", "Time by cause, largest first"].map((c) => h("th", { scope: "col" }, c)))),
      shares),
    h("table", { class: "causes" },
      h("caption", {}, "Where the window's GPU time went, lost time first"),
      h("thead", {}, h("tr", {}, ["Cause", "GPU time", "Share", "Lost", "Likely fix"].map((c) => h("th", { scope: "col" }, c)))),
      causes));
  const refresh = async () => {
    const until = new Date();
    const since = new Date(until.getTime() - hours * 3600_000);
    const rep = await api.diagnose({ since: since.toISOString(), until: until.toISOString(), pool: pool || undefined });
    head.textContent = `${rep.gpus} GPUs; computing ${pct(rep.utilisation)} of their time` +
      (rep.truncated ? " (more attempts touched the window than were read)" : "") + ".";
    nodes.replaceChildren(...rep.fleet.map(nodeRow));
    if (!rep.fleet.length) nodes.append(h("tr", {}, h("td", { colspan: 9 }, "No node has reported.")));
    range.replaceChildren(axis(rep.start, rep.end));
    lanes.replaceChildren(...(rep.lanes || []).map((l) => lane(l, rep.start, rep.end)));
    shares.replaceChildren(...(rep.lanes || []).map((l) => sharesRow(l, rep.start, rep.end)));
    causes.replaceChildren(...rep.causes.map((c) => h("tr", { "data-cause": c.cause },
      h("th", { scope: "row" }, causeInfo(c.cause).label),
      h("td", {}, duration(c.gpu_seconds)), h("td", {}, pct(c.share)), h("td", {}, c.lost ? "yes" : "no"),
      h("td", {}, c.lost ? c.fix : ""))));
  };
  await refresh();
  ctx.every(15000, refresh);
}
