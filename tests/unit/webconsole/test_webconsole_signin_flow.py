"""The console's sign-in in AWS (gpufleet/webconsole/signin_flow.js), run under Node with a fake fetch: PKCE
(RFC 7636 appendix B's example), the hosted UI's authorize URL, the callback (state checked), the token and
identity pool calls as Cognito expects them, renewal before expiry, and where a signed request goes (the
execute-api host, the stage in the canonical path; locally the page's own host)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from gpufleet.webconsole import ASSETS

SCRIPT = """
import * as f from %(module)s;
const config = {region: "eu-west-1", service: "execute-api", user_pool_client_id: "client1",
  hosted_ui: "https://acme.auth.eu-west-1.amazoncognito.com", identity_pool_id: "eu-west-1:pool",
  user_pool_provider: "cognito-idp.eu-west-1.amazonaws.com/eu-west-1_abc",
  api_url: "https://a1b2c3.execute-api.eu-west-1.amazonaws.com/v1"};
const calls = [];
const answers = {
  "https://acme.auth.eu-west-1.amazoncognito.com/oauth2/token": [200, {id_token: "h.eyJlbWFpbCI6ImFAYi5jIn0.s", access_token: "at", refresh_token: "rt", expires_in: 3600}],
  "GetId": [200, {IdentityId: "eu-west-1:id1"}],
  "GetCredentialsForIdentity": [200, {IdentityId: "eu-west-1:id1", Credentials: {AccessKeyId: "ASIA1", SecretKey: "sk", SessionToken: "st", Expiration: 1900000000}}],
};
const fakeFetch = async (url, init) => {
  const target = (init.headers["x-amz-target"] || "").split(".")[1];
  calls.push({url, method: init.method, headers: init.headers, body: init.body});
  const [status, body] = answers[target || url];
  return {ok: status < 400, status, json: async () => body};
};
const bytes = Uint8Array.from([116,24,223,180,151,153,224,37,79,250,96,125,216,173,187,186,22,212,37,77,105,214,191,240,91,88,5,88,83,132,141,121]);
const rfcVerifier = f.base64url(bytes);
const tokens = await f.exchangeCode(config, {code: "c0de", verifier: "v3rifier", redirectUri: "https://d1.cloudfront.net/"}, fakeFetch);
const creds = await f.identityCredentials(config, tokens.id_token, fakeFetch);
const refreshed = await f.refreshTokens(config, "rt", fakeFetch);
console.log(JSON.stringify({
  rfcVerifier, rfcChallenge: await f.challengeOf(rfcVerifier),
  verifier: f.newVerifier(),
  authorize: f.authorizeUrl(config, {state: "st4te", challenge: "ch", redirectUri: "https://d1.cloudfront.net/"}),
  callback: [f.parseCallback("?code=abc&state=st4te", "st4te"), f.parseCallback("?code=abc&state=other", "st4te"),
             f.parseCallback("?code=abc&state=st4te", null), f.parseCallback("?error=access_denied", "st4te"),
             f.parseCallback("", "st4te")],
  tokens, creds, refreshed, calls, name: f.nameOf(tokens.id_token),
  refresh: [f.needsRefresh(null, 0), f.needsRefresh(creds, 1900000000000 - 301000), f.needsRefresh(creds, 1900000000000 - 299000)],
  hosted: [f.usesHostedUi(config), f.usesHostedUi({region: "r", credentials: {}})],
  aws: f.signingTarget(config.api_url, "/v1/jobs/job_1", "d1.cloudfront.net"),
  local: f.signingTarget(undefined, "/v1/jobs", "127.0.0.1:8643"),
}));
"""


@pytest.fixture(scope="module")
def out() -> dict:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the console's modules cannot be run outside a browser here")
    run = subprocess.run([node, "--input-type=module", "-e",
                          SCRIPT % {"module": json.dumps((ASSETS / "signin_flow.js").as_uri())}],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_pkce_verifier_and_s256_challenge(out):
    # RFC 7636 appendix B
    assert out["rfcVerifier"] == "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
    assert out["rfcChallenge"] == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
    assert len(out["verifier"]) == 64 and set(out["verifier"]) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_authorize_url_and_callback(out):
    from urllib.parse import parse_qs, urlsplit

    url = urlsplit(out["authorize"])
    assert (url.scheme, url.netloc, url.path) == ("https", "acme.auth.eu-west-1.amazoncognito.com", "/oauth2/authorize")
    assert {k: v[0] for k, v in parse_qs(url.query).items()} == {
        "response_type": "code", "client_id": "client1", "redirect_uri": "https://d1.cloudfront.net/",
        "scope": "openid email", "state": "st4te", "code_challenge": "ch", "code_challenge_method": "S256"}
    ok, forged, no_request, refused, none = out["callback"]
    assert ok == {"code": "abc"}
    assert "error" in forged and "error" in no_request  # a state this tab did not send is refused
    assert refused == {"error": "access_denied"} and none is None


def test_token_and_identity_calls(out):
    from urllib.parse import parse_qs

    token, get_id, get_creds, refresh = out["calls"]
    assert token["url"] == "https://acme.auth.eu-west-1.amazoncognito.com/oauth2/token" and token["method"] == "POST"
    assert token["headers"]["content-type"] == "application/x-www-form-urlencoded"
    assert {k: v[0] for k, v in parse_qs(token["body"]).items()} == {
        "grant_type": "authorization_code", "client_id": "client1", "code": "c0de",
        "redirect_uri": "https://d1.cloudfront.net/", "code_verifier": "v3rifier"}  # no client secret
    login = {"cognito-idp.eu-west-1.amazonaws.com/eu-west-1_abc": out["tokens"]["id_token"]}
    for call, target in ((get_id, "GetId"), (get_creds, "GetCredentialsForIdentity")):
        assert call["url"] == "https://cognito-identity.eu-west-1.amazonaws.com/"
        assert call["headers"]["x-amz-target"] == f"AWSCognitoIdentityService.{target}"
        assert call["headers"]["content-type"] == "application/x-amz-json-1.1"
        assert "authorization" not in {k.lower() for k in call["headers"]}  # unsigned: the id token is the login
    assert json.loads(get_id["body"]) == {"IdentityPoolId": "eu-west-1:pool", "Logins": login}
    assert json.loads(get_creds["body"]) == {"IdentityId": "eu-west-1:id1", "Logins": login}
    assert out["creds"] == {"access_key_id": "ASIA1", "secret_access_key": "sk", "session_token": "st",
                            "expires_at": 1_900_000_000_000, "identity_id": "eu-west-1:id1"}
    assert {k: v[0] for k, v in parse_qs(refresh["body"]).items()} == {
        "grant_type": "refresh_token", "client_id": "client1", "refresh_token": "rt"}
    assert out["name"] == "a@b.c"
    assert out["refresh"] == [True, False, True]  # renewed five minutes before expiry


def test_signing_target(out):
    assert out["hosted"] == [True, False]
    # the execute-api host, and the stage in the path API Gateway verifies the signature against
    assert out["aws"] == {"url": "https://a1b2c3.execute-api.eu-west-1.amazonaws.com/v1/v1/jobs/job_1",
                          "host": "a1b2c3.execute-api.eu-west-1.amazonaws.com", "path": "/v1/v1/jobs/job_1"}
    assert out["local"] == {"url": "/v1/jobs", "host": "127.0.0.1:8643", "path": "/v1/jobs"}


PAGE = """
const store = new Map();
globalThis.sessionStorage = {getItem: (k) => store.has(k) ? store.get(k) : null, setItem: (k, v) => store.set(k, String(v)),
                             removeItem: (k) => store.delete(k)};
const assigned = [];
globalThis.location = {origin: "https://d1.cloudfront.net", host: "d1.cloudfront.net", pathname: "/", hash: "#/signin",
                       search: "", assign: (u) => assigned.push(u)};
globalThis.history = {replaceState: (s, t, u) => { location.search = ""; location.hash = u.slice(1); }};
const config = {region: "eu-west-1", service: "execute-api", user_pool_client_id: "client1",
  hosted_ui: "https://acme.auth.eu-west-1.amazoncognito.com", identity_pool_id: "eu-west-1:pool",
  user_pool_provider: "cognito-idp.eu-west-1.amazonaws.com/eu-west-1_abc",
  api_url: "https://a1b2c3.execute-api.eu-west-1.amazonaws.com/v1"};
const calls = [];
let expiration = Date.now() / 1000 + 3600;
globalThis.fetch = async (url, init = {}) => {
  const target = ((init.headers || {})["x-amz-target"] || "").split(".")[1];
  calls.push({url, target, body: init.body, headers: init.headers});
  const json = (status, body) => ({ok: status < 400, status, headers: {get: () => "application/json"}, json: async () => body});
  if (url === "/console/config.json") return json(200, config);
  if (url.endsWith("/oauth2/token")) return json(200, {id_token: "h.eyJlbWFpbCI6ImFAYi5jIn0.s", refresh_token: "rt"});
  if (target === "GetId") return json(200, {IdentityId: "id1"});
  if (target === "GetCredentialsForIdentity")
    return json(200, {Credentials: {AccessKeyId: "ASIA" + calls.length, SecretKey: "sk", SessionToken: "st", Expiration: expiration}});
  if (url.includes("/v1/v1/admin/")) return json(403, {title: "Forbidden"});
  return json(200, {items: []});
};
const { Api } = await import(%(module)s);
// 1. not signed in: Sign in goes to the hosted UI with a challenge; the tab keeps the verifier and state
let api = await Api.load();
const before = {hosted: api.hostedUi, credentials: api.config.credentials || null};
await api.startHostedSignIn();
const pending = JSON.parse(store.get("gpufleet.console.pkce"));
const authorize = new URL(assigned[0]);
// 2. back from the hosted UI with the code: tokens, credentials, the admin probe signed for execute-api
location.search = `?code=c0de&state=${authorize.searchParams.get("state")}`;
calls.length = 0;
api = await Api.load();
await api.listJobs({statuses: ["RUNNING"]});
const signedIn = {identity: api.config.identity, admin: api.isAdmin, search: location.search, hash: location.hash,
                  calls: calls.map((c) => [c.url, c.target || null, c.headers && c.headers["x-amz-security-token"] || null])};
const tokenBody = Object.fromEntries(new URLSearchParams(calls[1].body));
// 3. credentials about to expire are renewed before the next request
api.config.credentials.expires_at = Date.now() + 60000;
calls.length = 0;
await api.pools();
console.log(JSON.stringify({before, pending, authorize: Object.fromEntries(authorize.searchParams), signedIn, tokenBody,
  renewed: calls.map((c) => c.target || c.url), key: api.config.credentials.access_key_id}));
"""


def test_the_page_signs_in_through_the_hosted_ui_and_signs_for_execute_api():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    run = subprocess.run([node, "--input-type=module", "-e", PAGE % {"module": json.dumps((ASSETS / "api.js").as_uri())}],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["before"] == {"hosted": True, "credentials": None}
    assert out["authorize"]["code_challenge_method"] == "S256" and out["authorize"]["state"] == out["pending"]["state"]
    assert out["tokenBody"]["code_verifier"] == out["pending"]["verifier"] and out["tokenBody"]["code"] == "c0de"
    signed = out["signedIn"]
    assert signed["identity"] == "a@b.c" and signed["admin"] is False and signed["search"] == ""
    api = "https://a1b2c3.execute-api.eu-west-1.amazonaws.com/v1"
    assert signed["calls"] == [
        ["/console/config.json", None, None],
        ["https://acme.auth.eu-west-1.amazoncognito.com/oauth2/token", None, None],
        ["https://cognito-identity.eu-west-1.amazonaws.com/", "GetId", None],
        ["https://cognito-identity.eu-west-1.amazonaws.com/", "GetCredentialsForIdentity", None],
        [f"{api}/v1/admin/tenants", None, "st"],
        [f"{api}/v1/jobs?limit=50&status=RUNNING", None, "st"]]
    assert out["renewed"] == ["GetId", "GetCredentialsForIdentity", f"{api}/v1/pools"]
