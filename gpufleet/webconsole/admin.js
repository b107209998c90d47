// Administration (operators): tenants, quotas, safety profiles, nodes and quarantined jobs, read through the
// administration API (/v1/admin/...); the actions are the API's own (onboard a tenant, drain, undrain or
// deregister a node, release or cancel a quarantined job). A caller without the admin policy gets the API's 403.
import { describeSpec, h, showError, statusBadge, when } from "./ui.js";

export const SECTIONS = [
  ["tenants", "Tenants"], ["quotas", "Quotas"], ["safety", "Safety profiles"], ["nodes", "Nodes"],
  ["quarantine", "Quarantined jobs"],
];

function table(caption, cols, rows, empty) {
  return h("table", { class: "admin" },
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, cols.map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: cols.length }, empty))));
}

// milli-GPUs per GPU type -> "any: 4, L4: 1.5" (GPUs)
function gpus(byType) {
  const parts = Object.entries(byType || {}).map(([t, m]) => `${t === "*" ? "any" : t}: ${Number(m) / 1000}`);
  return parts.length ? parts.join(", ") : "—";
}

function action(label, name, run) {
  return h("button", {
    type: "button", "aria-label": name,
    onclick: async (ev) => {
      ev.target.disabled = true;
      try {
        await run();
      } catch (err) {
        showError(err);
      }
    },
  }, label);
}

// every tenant an operator may look at: the onboarded ones and those with quota (the bootstrap's)
async function tenantNames(api) {
  const [tenants, quotas] = await Promise.all([api.admin("tenants"), api.admin("quota")]);
  const names = new Set(tenants.items.map((t) => t.tenant));
  for (const q of quotas.items) names.add(String(q.path).split("/")[0]);
  return [...names].sort();
}

async function tenants(api, box, rerender) {
  const { items } = await api.admin("tenants");
  const teams = await Promise.all(items.map((t) => api.admin(`tenants/${encodeURIComponent(t.tenant)}/teams`)));
  const onsubmit = async (ev) => {
    ev.preventDefault();
    const data = new FormData(ev.target);
    try {
      await api.admin("tenants", { method: "POST", body: { tenant: data.get("tenant"), display_name: data.get("display_name") || undefined } });
      await rerender();
    } catch (err) {
      showError(err);
    }
  };
  box.append(
    table("Onboarded tenants", ["Tenant", "Display name", "Placement policy", "Teams", "Created", "Version"],
      items.map((t, i) => h("tr", { "data-tenant": t.tenant },
        h("th", { scope: "row" }, t.tenant), h("td", {}, t.display_name || ""), h("td", {}, t.placement_policy || "default"),
        h("td", {}, teams[i].items.map((x) => x.team).join(", ") || "none"), h("td", {}, when(t.created_at)),
        h("td", {}, String(t.version ?? "")))),
      "No tenant is onboarded yet."),
    h("h2", {}, "Onboard a tenant"),
    h("form", { class: "filters", "aria-label": "Onboard a tenant", onsubmit },
      h("label", { for: "t-name" }, "Tenant"),
      h("input", { id: "t-name", name: "tenant", type: "text", required: true, maxlength: 63, autocomplete: "off" }),
      h("label", { for: "t-display" }, "Display name"),
      h("input", { id: "t-display", name: "display_name", type: "text" }),
      h("button", { type: "submit" }, "Onboard")));
}

// the usage counters of a quota node (used_<type> / used_all, milli-GPUs: gpufleet/store/quotas.py)
export function usageOf(q) {
  const out = {};
  for (const [k, v] of Object.entries(q)) if (k.startsWith("used_")) out[k === "used_all" ? "*" : k.slice(5)] = v;
  return out;
}

async function quotas(api, box) {
  const { items } = await api.admin("quota");
  box.append(table("Quota nodes (GPUs per GPU type; any: every type)",
    ["Path", "Guaranteed", "May borrow", "Limit", "Weight", "In use", "Version"],
    items.map((q) => h("tr", { "data-quota": q.path },
      h("th", { scope: "row" }, q.path), h("td", {}, gpus(q.guarantee)), h("td", {}, gpus(q.borrow_limit)),
      h("td", {}, gpus(q.limits)), h("td", {}, Object.entries(q.weight || {}).map(([t, w]) => `${t === "*" ? "any" : t}: ${w}`).join(", ") || "1"),
      h("td", {}, gpus(usageOf(q))), h("td", {}, q.version != null ? String(q.version) : "set outside the API"))),
    "No quota is set."));
}

async function safety(api, box) {
  const names = await tenantNames(api);
  const profiles = await Promise.all(names.map((t) => api.admin(`tenants/${encodeURIComponent(t)}/safety-profile`)));
  box.append(table("Tier-2 safety profile per tenant", ["Tenant", "Profile", "Backend", "Frame thresholds", "Max frames", "Version"],
    names.map((t, i) => {
      const p = profiles[i];
      return h("tr", { "data-tenant": t },
        h("th", { scope: "row" }, t), h("td", {}, p ? "own" : "the deployment's default"),
        h("td", {}, p ? p.backend || "" : ""),
        h("td", {}, p ? Object.entries(p.frame_thresholds || {}).map(([k, v]) => `${k} ≥ ${v}`).join(", ") : ""),
        h("td", {}, p && p.max_frames != null ? String(p.max_frames) : ""), h("td", {}, p ? String(p.version ?? "") : ""));
    }), "No tenant."));
}

// DELETE /v1/admin/nodes/{id}, confirmed; the API refuses a node still holding attempts (409, naming them):
// asked again, it deregisters with force (those attempts end at their heartbeat timeout and are placed again)
function deregister(api, node, rerender) {
  const path = `nodes/${encodeURIComponent(node)}`;
  return action("Deregister", `Deregister node ${node}`, async () => {
    if (!window.confirm(`Deregister node ${node}? It gets no more placements and the node API refuses its calls; `
      + "registering it again undoes this.")) {
      await rerender();
      return;
    }
    try {
      await api.admin(path, { method: "DELETE" });
    } catch (err) {
      if (err.status !== 409 || !window.confirm(`${err.message}\n\nDeregister anyway?`)) throw err;
      await api.admin(path, { method: "DELETE", query: [["force", "true"]] });
    }
    await rerender();
  });
}

async function nodes(api, box, rerender) {
  const { items } = await api.admin("nodes");
  box.append(table("Registered nodes (their state now: the Fleet page)",
    ["Node", "Pool", "Site", "GPUs", "GPU memory", "Drained", "Registered", "Actions"],
    items.map((n) => h("tr", { "data-node": n.node_id },
      h("th", { scope: "row" }, n.node_id), h("td", {}, n.pool), h("td", {}, n.site || ""),
      h("td", {}, `${n.gpus} × ${n.gpu_type}`), h("td", {}, n.gpu_memory_gb ? `${n.gpu_memory_gb} GB` : ""),
      h("td", {}, n.drained ? "yes" : "no"), h("td", {}, when(n.registered_at)),
      h("td", {}, n.drained
        ? action("Undrain", `Undrain node ${n.node_id}`, async () => { await api.admin(`nodes/${n.node_id}/undrain`, { method: "POST" }); await rerender(); })
        : action("Drain", `Drain node ${n.node_id}`, async () => { await api.admin(`nodes/${n.node_id}/drain`, { method: "POST" }); await rerender(); }),
        " ", deregister(api, n.node_id, rerender)))),
    "No node is registered."));
}

async function quarantine(api, box, rerender) {
  const names = await tenantNames(api);
  const pages = await Promise.all(names.map((t) => api.admin("quarantine", { query: [["tenant", t], ["limit", 100]] })));
  const jobs = pages.flatMap((p) => p.jobs);
  const act = (job, verb) => async () => {
    await api.admin(`jobs/${encodeURIComponent(job.job_id)}/${verb}`, { method: "POST", body: { reason: `console: ${verb}` } });
    await rerender();
  };
  box.append(table(`Quarantined jobs of ${names.length} tenants (crashed three workers; not charged)`,
    ["Job", "Tenant", "Status", "Workload", "Attempts", "Submitted", "Actions"],
    jobs.map((j) => h("tr", { "data-job": j.job_id },
      h("th", { scope: "row" }, j.job_id), h("td", {}, j.tenant || ""), h("td", {}, statusBadge(j.status)),
      h("td", { class: "workload" }, describeSpec(j.spec)), h("td", {}, String(j.attempt_count ?? "")),
      h("td", {}, when(j.created_at)),
      h("td", {}, action("Release", `Release job ${j.job_id}`, act(j, "release")), " ",
        action("Cancel", `Cancel quarantined job ${j.job_id}`, act(j, "cancel"))))),
    "No job is quarantined."));
}

const LOADERS = { tenants, quotas, safety, nodes, quarantine };

export async function adminView(api, main, params, ctx, section) {
  const current = LOADERS[section] ? section : "tenants";
  const box = h("div", {});
  main.append(
    h("h1", { tabindex: "-1" }, `Administration: ${SECTIONS.find(([k]) => k === current)[1]}`),
    h("nav", { class: "subnav", "aria-label": "Administration" },
      h("ul", {}, SECTIONS.map(([k, label]) => h("li", {},
        h("a", { href: `#/admin/${k}`, "aria-current": k === current ? "page" : undefined }, label))))),
    box);
  const rerender = async () => {
    const fresh = h("div", {});
    await LOADERS[current](api, fresh, rerender);
    box.replaceChildren(...fresh.childNodes);
  };
  await rerender();
}
