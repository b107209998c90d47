// The per-GPU timeline's data, shaped for drawing (pure: no DOM, unit-tested under Node).
// A lane is {node, pool, gpu, segments: [[start, end, cause, job id or null], ...]} (GET /v1/admin/diagnose?lanes=true).

// every cause of gpufleet/diagnose/attribution.py, in drawing order, each with a short code: the timeline
// carries the code as text and a pattern per group, so that it reads without colour
export const CAUSES = [
  ["computing", "C", "computing"],
  ["model_load", "M", "loading the model"],
  ["staging", "S", "staging inputs"],
  ["checkpoint", "K", "checkpointing"],
  ["post_processing", "P", "post-processing"],
  ["starting", "T", "starting"],
  ["held_idle", "H", "booked, idle"],
  ["unreported", "U", "booked, phase not reported"],
  ["free_fragmentation", "F", "free: fragmentation"],
  ["free_quota", "Q", "free: quota"],
  ["free_affinity", "A", "free: affinity"],
  ["free_sched_latency", "L", "free: scheduler latency"],
  ["free_head_of_line", "O", "free: head of line"],
  ["free_no_work", "·", "free, nothing to run"],
  ["drained", "D", "drained"],
].map(([cause, code, label]) => ({ cause, code, label }));

const BY_CAUSE = Object.fromEntries(CAUSES.map((c) => [c.cause, c]));

export function causeInfo(cause) {
  return BY_CAUSE[cause] || { cause, code: "?", label: cause };
}

// Adjacent segments of one cause (and job) become one; segments are clipped to [start, end).
export function mergeSegments(segments, start, end) {
  const out = [];
  for (const [s0, e0, cause, job] of segments) {
    const s = Math.max(s0, start);
    const e = Math.min(e0, end);
    if (e <= s) continue;
    const last = out[out.length - 1];
    if (last && last.cause === cause && last.job === (job ?? null) && Math.abs(last.end - s) < 1e-6) last.end = e;
    else out.push({ start: s, end: e, cause, job: job ?? null });
  }
  return out;
}

// Seconds per cause on one lane, largest first: [{cause, seconds, share}] (share of the window).
export function laneShares(segments, start, end) {
  const total = {};
  for (const seg of mergeSegments(segments, start, end)) total[seg.cause] = (total[seg.cause] || 0) + seg.end - seg.start;
  const span = end - start;
  return Object.entries(total)
    .map(([cause, seconds]) => ({ cause, seconds, share: span > 0 ? seconds / span : 0 }))
    .sort((a, b) => b.seconds - a.seconds || a.cause.localeCompare(b.cause));
}

// "2h 5m", "40s": a duration for people
export function duration(seconds) {
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${s % 60}s`;
  return `${Math.floor(m / 60)}h ${m % 60}m`;
}
