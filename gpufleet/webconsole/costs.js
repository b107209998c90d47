// Costs: the billing ledger grouped by team, user, label or pool over a chosen window (GET /v1/costs);
// charged and waived apart.
import { h } from "./ui.js";

const GROUPS = ["tenant", "team", "user", "label", "pool"];

function dayInput(id, label, value) {
  return [h("label", { for: id }, label), h("input", { id, name: id, type: "date", value })];
}

function isoDay(d) {
  return d.toISOString().slice(0, 10);
}

function groupRow(g) {
  return h("tr", {},
    h("th", { scope: "row" }, g.key),
    h("td", {}, `$${g.charged_usd}`), h("td", {}, Number(g.charged_gpu_seconds).toFixed(1)),
    h("td", {}, String(g.charged_attempts)),
    h("td", {}, `$${g.waived_usd}`), h("td", {}, Number(g.waived_gpu_seconds).toFixed(1)),
    h("td", {}, String(g.waived_attempts)));
}

export async function costsView(api, main, params) {
  const by = GROUPS.includes(params.get("by")) ? params.get("by") : "user";
  const since = params.get("since") || isoDay(new Date(Date.now() - 7 * 86400_000));
  const until = params.get("until") || "";
  const labelKey = params.get("label_key") || "";
  const onsubmit = (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(ev.target).entries()) if (v) q.append(k, v);
    location.hash = "#/costs?" + q;
  };
  main.append(
    h("h1", { tabindex: "-1" }, "Costs"),
    h("form", { class: "filters", "aria-label": "Cost report window and grouping", onsubmit },
      h("label", { for: "by" }, "Group by"),
      h("select", { id: "by", name: "by" }, GROUPS.map((g) => h("option", { value: g, selected: g === by }, g))),
      h("label", { for: "label_key" }, "Label key (group by label)"),
      h("input", { id: "label_key", name: "label_key", type: "text", value: labelKey }),
      dayInput("since", "From (UTC day, inclusive)", since),
      dayInput("until", "To (UTC day, exclusive)", until),
      h("button", { type: "submit" }, "Show")));
  const query = [["by", by], ["label_key", by === "label" ? labelKey : ""],
    ["since", since ? `${since}T00:00:00Z` : ""], ["until", until ? `${until}T00:00:00Z` : ""]];
  const rep = await api.request("GET", "/v1/costs", { query });
  const cols = ["Group", "Charged", "Charged GPU-seconds", "Charged attempts", "Waived", "Waived GPU-seconds",
    "Waived attempts"];
  main.append(h("table", { class: "costs" },
    h("caption", {}, `Costs of tenant ${rep.tenant} by ${rep.by}` + (rep.since ? ` from ${rep.since}` : "") +
      (rep.until ? ` until ${rep.until}` : "")),
    h("thead", {}, h("tr", {}, cols.map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, rep.groups.length ? rep.groups.map((g) => groupRow(g))
      : h("tr", {}, h("td", { colspan: 7 }, "Nothing was billed in this window."))),
    h("tfoot", {}, groupRow({ ...rep.total, key: "Total" }))));
}
