// Small DOM helpers: h() builds elements (text is always set as text, never parsed as HTML).

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// A status is shown as a symbol AND its name (never colour alone).
const SYMBOL = {
  QUEUED: "○", PENDING: "◔", SCHEDULED: "◑", RUNNING: "▶", FINALIZING: "◕", SUCCEEDED: "✓",
  FAILED: "✗", BLOCKED: "⊘", QUARANTINED: "⚠", CANCELLED: "■", EXPIRED: "⌛", REJECTED: "⊘",
};

export function statusBadge(status) {
  return h("span", { class: `status status-${String(status).toLowerCase()}`, "data-status": status },
    h("span", { "aria-hidden": "true" }, SYMBOL[status] || "•"), " ", status);
}

export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return h("time", { datetime: iso, title: iso }, d.toLocaleString(undefined, { hour12: false }));
}

export function progressOf(job) {
  const p = job.progress;
  if (!p || !p.total) return h("span", { class: "muted" }, "—");
  const label = `${p.step} of ${p.total} steps`;
  return h("span", { class: "progress" },
    h("progress", { max: p.total, value: p.step, "aria-label": label }), " ", `${p.step}/${p.total}`);
}

export function describeSpec(spec) {
  const w = (spec && spec.workload) || {};
  if (w.kind === "video.generate") return w.prompt;
  if (w.kind === "container") return w.image || "container job";
  return w.kind || "";
}

export function keyValues(obj) {
  if (!obj || !Object.keys(obj).length) return h("p", { class: "muted" }, "none");
  return h("dl", { class: "kv" }, Object.entries(obj).flatMap(([k, v]) => [
    h("dt", {}, k),
    h("dd", {}, typeof v === "object" && v !== null ? JSON.stringify(v) : String(v)),
  ]));
}

// Announce a problem in the page's alert region (role=alert) instead of throwing.
export function showError(err) {
  const box = document.getElementById("alert");
  box.replaceChildren(h("p", {}, err && err.status ? `Error ${err.status}: ${err.message}` : String(err && err.message || err)));
  box.hidden = false;
}

export function clearError() {
  const box = document.getElementById("alert");
  box.replaceChildren();
  box.hidden = true;
}
