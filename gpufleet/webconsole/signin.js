// Sign in with other credentials (an access key the operator handed you, e.g. the local stack's
// profiles/operator.json): the page then signs with them; the admin pages appear when the API says the
// principal has the admin policy. In AWS the identity pool's short-lived credentials take this place.
import { h, showError } from "./ui.js";

export async function signinView(api, main) {
  if (api.hostedUi) return hostedView(api, main);
  const status = h("p", { role: "status" }, `Signed in as ${api.config.identity || "the served credentials"}` +
    (api.isAdmin ? " (admin)." : "."));
  const onsubmit = async (ev) => {
    ev.preventDefault();
    const data = new FormData(ev.target);
    const credentials = { access_key_id: String(data.get("akid")).trim(), secret_access_key: String(data.get("secret")) };
    if (data.get("token")) credentials.session_token = String(data.get("token"));
    try {
      const admin = await api.signIn(credentials);
      document.dispatchEvent(new CustomEvent("gpufleet:identity"));
      location.hash = admin ? "#/fleet" : "#/jobs";
    } catch (err) {
      showError(err);
    }
  };
  main.append(
    h("h1", { tabindex: "-1" }, "Sign in"),
    status,
    h("form", { class: "submit", "aria-label": "Sign in with an access key", onsubmit },
      h("div", { class: "field" }, h("label", { for: "akid" }, "Access key id"),
        h("input", { id: "akid", name: "akid", type: "text", required: true, autocomplete: "username" })),
      h("div", { class: "field" }, h("label", { for: "secret" }, "Secret access key"),
        h("input", { id: "secret", name: "secret", type: "password", required: true, autocomplete: "current-password" })),
      h("div", { class: "field" }, h("label", { for: "token" }, "Session token (temporary credentials only)"),
        h("input", { id: "token", name: "token", type: "password", autocomplete: "off" })),
      h("p", { class: "hint" }, "Kept in this tab only (sessionStorage) until you sign out or close it."),
      h("div", {}, h("button", { type: "submit" }, "Sign in"))),
    h("p", {}, h("button", {
      type: "button",
      onclick: () => { api.signOut(); location.replace(location.pathname + "#/jobs"); location.reload(); },
    }, "Sign out (back to the served credentials)")));
}

// In AWS: sign in through the Cognito hosted UI (code flow with PKCE; the identity pool then hands this tab
// short-lived credentials for your principal's role), sign out ends that session too.
function hostedView(api, main) {
  const signedIn = Boolean(api.config.credentials);
  main.append(
    h("h1", { tabindex: "-1" }, "Sign in"),
    h("p", { role: "status" }, signedIn
      ? `Signed in as ${api.config.identity || "your identity"}` + (api.isAdmin ? " (admin)." : ".")
      : "Not signed in."),
    h("p", {}, h("button", {
      type: "button",
      onclick: () => api.startHostedSignIn().catch(showError),
    }, signedIn ? "Sign in again" : "Sign in")),
    signedIn ? h("p", {}, h("button", { type: "button", onclick: () => api.signOut() }, "Sign out")) : null,
    h("p", { class: "hint" }, "Tokens and credentials are kept in this tab only (sessionStorage)."));
}
