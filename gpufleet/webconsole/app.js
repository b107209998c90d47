// The console's router: #/jobs, #/jobs/<id>, #/queue, #/submit, #/costs, #/signin and, for operators, #/fleet
// and #/admin/<section>. Each view renders into <main> and may
// poll (ctx.every); navigating away stops its polling. Failures go to the alert region, never the console.
import { adminView } from "./admin.js";
import { Api } from "./api.js";
import { costsView } from "./costs.js";
import { fleetView } from "./fleet.js";
import { jobView } from "./job.js";
import { jobsView } from "./jobs.js";
import { queueView } from "./queue.js";
import { signinView } from "./signin.js";
import { submitView } from "./submit.js";
import { clearError, h, showError } from "./ui.js";

const ROUTES = [
  [/^\/jobs\/([A-Za-z0-9_-]+)$/, jobView, "Job"],
  [/^\/jobs$/, jobsView, "Jobs"],
  [/^\/queue$/, queueView, "Queue"],
  [/^\/submit$/, submitView, "Submit"],
  [/^\/costs$/, costsView, "Costs"],
  [/^\/signin$/, signinView, "Sign in"],
  [/^\/fleet$/, fleetView, "Fleet"],
  [/^\/admin(?:\/([a-z]+))?$/, adminView, "Administration"],
];

let generation = 0;

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/jobs";
  const [path, query] = raw.split("?");
  return { path, params: new URLSearchParams(query || "") };
}

async function render(api) {
  const gen = ++generation;
  const { path, params } = parseHash();
  // each render gets its own container: a slower earlier view that is still loading writes into a detached one
  const main = h("div", { class: "view" });
  document.getElementById("main").replaceChildren(main);
  clearError();
  const route = ROUTES.find(([re]) => re.test(path));
  for (const a of document.querySelectorAll("nav a")) {
    if (path.startsWith(a.getAttribute("href").slice(1))) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (!route) {
    main.append(h("h1", { tabindex: "-1" }, "Not found"), h("p", {}, h("a", { href: "#/jobs" }, "Back to the jobs")));
    return;
  }
  const [re, view, title] = route;
  const ctx = {
    // run fn every ms while this view is shown; a failure is shown and polling goes on
    every(ms, fn) {
      const tick = async () => {
        if (gen !== generation) return;
        try {
          await fn();
        } catch (err) {
          if (gen === generation) showError(err);
        }
        if (gen === generation) setTimeout(tick, ms);
      };
      setTimeout(tick, ms);
    },
  };
  try {
    await view(api, main, params, ctx, ...path.match(re).slice(1));
  } catch (err) {
    if (gen === generation) showError(err);
  }
  document.title = `${title} · gpufleet console`;
  const heading = main.querySelector("h1");
  if (heading && gen === generation && document.activeElement === document.body) heading.focus({ preventScroll: true });
}

async function boot() {
  let api;
  try {
    api = await Api.load();
  } catch (err) {
    showError(err);
    return;
  }
  const showIdentity = () => {
    document.getElementById("identity").textContent = api.config.identity || "";
    // the operators' pages, linked only when the API granted this principal the admin policy (signin.js)
    for (const li of document.querySelectorAll("nav li.admin-only")) li.hidden = !api.isAdmin;
  };
  showIdentity();
  // in AWS, nobody is signed in until the hosted UI says so
  if (api.hostedUi && !api.config.credentials) location.hash = "#/signin";
  document.addEventListener("gpufleet:identity", showIdentity);
  window.addEventListener("hashchange", () => render(api));
  await render(api);
}

boot();
