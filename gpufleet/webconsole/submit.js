// Submit a video job: prompt, frames, steps, pool and labels; one Idempotency-Key per form, so a
// repeated click replays the first submission instead of making a second job.
import { h, showError } from "./ui.js";

export function parseLabels(text) {
  const labels = {};
  for (const line of String(text || "").split(/[\n,]/).map((s) => s.trim()).filter(Boolean)) {
    const at = line.indexOf("=");
    if (at < 1) throw new Error(`label "${line}" is not key=value`);
    labels[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  }
  return labels;
}

function field(id, label, input, hint) {
  return h("div", { class: "field" }, h("label", { for: id }, label), input,
    hint ? h("p", { class: "hint", id: `${id}-hint` }, hint) : null);
}

export async function submitView(api, main) {
  const key = crypto.randomUUID();
  const pools = await api.pools();
  const form = h("form", { class: "submit", "aria-labelledby": "submit-title" },
    field("prompt", "Prompt", h("textarea", { id: "prompt", name: "prompt", required: true, rows: 3, maxlength: 2000 })),
    field("frames", "Frames", h("input", { id: "frames", name: "frames", type: "number", min: 1, max: 257, step: 4,
      value: 5, required: true, "aria-describedby": "frames-hint" }), "4k+1: 1, 5, 9, …"),
    field("steps", "Denoising steps", h("input", { id: "steps", name: "steps", type: "number", min: 1, max: 200,
      value: 10, required: true })),
    field("pool", "Pool", h("select", { id: "pool", name: "pool" }, h("option", { value: "" }, "any pool"),
      pools.pools.map((p) => h("option", { value: p.name }, `${p.name} (${p.kind}, ${p.gpu_type})`)))),
    field("labels", "Labels", h("textarea", { id: "labels", name: "labels", rows: 2, "aria-describedby": "labels-hint" }),
      "one key=value per line"),
    h("button", { type: "submit", id: "submit-job" }, "Submit job"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const data = new FormData(form);
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      const spec = {
        workload: { kind: "video.generate", prompt: data.get("prompt"), frames: Number(data.get("frames")),
          steps: Number(data.get("steps")) },
        labels: parseLabels(data.get("labels")),
      };
      if (data.get("pool")) spec.pools = [data.get("pool")];
      const job = await api.submit(spec, key);
      location.hash = `#/jobs/${job.job_id}`;
    } catch (err) {
      showError(err);
    } finally {
      button.disabled = false;
    }
  });
  main.append(h("h1", { tabindex: "-1", id: "submit-title" }, "Submit a job"), form);
}
