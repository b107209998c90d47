// Sign-in in AWS: the Cognito hosted UI's authorization code flow with PKCE (RFC 7636), then short-lived IAM
// credentials from the identity pool, and where a signed request goes. No DOM here: every network call takes a
// `fetch` (the browser's, or a fake in tests), so the module runs under Node (tests/unit/webconsole).
//
// config (the deployed /console/config.json, infra/console.py): {region, service, api_url (with the stage),
// user_pool_client_id, hosted_ui, identity_pool_id, user_pool_provider}. Locally there is no user_pool_client_id
// and the page keeps signing with the served credentials.

export const SCOPES = "openid email";
// credentials are renewed this long before they expire
export const REFRESH_MARGIN_MS = 5 * 60 * 1000;

// true when the page was served by the AWS deployment (sign in through the hosted UI)
export function usesHostedUi(config) {
  return Boolean(config && config.user_pool_client_id && config.hosted_ui && config.identity_pool_id);
}

export function base64url(bytes) {
  let bin = "";
  for (const b of new Uint8Array(bytes)) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

// a code verifier: 43 to 128 characters of [A-Za-z0-9-._~] (here 64, from 48 random bytes)
export function newVerifier(random = (n) => crypto.getRandomValues(new Uint8Array(n))) {
  return base64url(random(48));
}

// the S256 challenge of a verifier: base64url(SHA-256(verifier))
export async function challengeOf(verifier) {
  return base64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
}

// the hosted UI's authorize URL for this client, this state and challenge
export function authorizeUrl(config, { state, challenge, redirectUri }) {
  const q = new URLSearchParams({
    response_type: "code", client_id: config.user_pool_client_id, redirect_uri: redirectUri,
    scope: SCOPES, state, code_challenge: challenge, code_challenge_method: "S256",
  });
  return `${config.hosted_ui}/oauth2/authorize?${q}`;
}

// the hosted UI's answer in the page's query string: {code} when it is for `expectedState`, {error} when the
// hosted UI refused or the state does not match (a forged or stale callback), null when there is none
export function parseCallback(search, expectedState) {
  const q = new URLSearchParams(search);
  if (q.has("error")) return { error: q.get("error_description") || q.get("error") };
  const code = q.get("code");
  if (!code) return null;
  if (!expectedState || q.get("state") !== expectedState) return { error: "the sign-in answer does not match this tab's request" };
  return { code };
}

async function tokenCall(config, form, fetchFn) {
  const resp = await fetchFn(`${config.hosted_ui}/oauth2/token`, {
    method: "POST", headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams(form).toString(), credentials: "omit", cache: "no-store",
  });
  const data = await resp.json();
  if (!resp.ok) throw new Error(`sign-in refused: ${data.error_description || data.error || resp.status}`);
  return data;
}

// the authorization code and the tab's verifier for tokens {id_token, access_token, refresh_token, expires_in}
export function exchangeCode(config, { code, verifier, redirectUri }, fetchFn = fetch) {
  return tokenCall(config, {
    grant_type: "authorization_code", client_id: config.user_pool_client_id, code, redirect_uri: redirectUri,
    code_verifier: verifier,
  }, fetchFn);
}

// new id/access tokens from the refresh token (the answer has no new refresh token)
export function refreshTokens(config, refreshToken, fetchFn = fetch) {
  return tokenCall(config, {
    grant_type: "refresh_token", client_id: config.user_pool_client_id, refresh_token: refreshToken,
  }, fetchFn);
}

async function identityCall(config, target, body, fetchFn) {
  const resp = await fetchFn(`https://cognito-identity.${config.region}.amazonaws.com/`, {
    method: "POST", credentials: "omit", cache: "no-store", body: JSON.stringify(body),
    headers: { "content-type": "application/x-amz-json-1.1", "x-amz-target": `AWSCognitoIdentityService.${target}` },
  });
  const data = await resp.json();
  if (!resp.ok) throw new Error(`no credentials from the identity pool: ${data.message || data.__type || resp.status}`);
  return data;
}

// the identity pool's credentials for the id token: GetId, then GetCredentialsForIdentity (both unsigned, the id
// token is the login) -> {access_key_id, secret_access_key, session_token, expires_at (ms), identity_id}
export async function identityCredentials(config, idToken, fetchFn = fetch) {
  const logins = { [config.user_pool_provider]: idToken };
  const { IdentityId } = await identityCall(config, "GetId", { IdentityPoolId: config.identity_pool_id, Logins: logins }, fetchFn);
  const { Credentials: c } = await identityCall(config, "GetCredentialsForIdentity",
    { IdentityId, Logins: logins }, fetchFn);
  return {
    access_key_id: c.AccessKeyId, secret_access_key: c.SecretKey, session_token: c.SessionToken,
    expires_at: Math.round(Number(c.Expiration) * 1000), identity_id: IdentityId,
  };
}

// whether credentials are missing or expire within the margin
export function needsRefresh(credentials, now = Date.now(), margin = REFRESH_MARGIN_MS) {
  return !credentials || !credentials.expires_at || credentials.expires_at - now <= margin;
}

// the user's name from an id token's claims (not verified here: the identity pool verifies the token)
export function nameOf(idToken) {
  try {
    const payload = idToken.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const claims = JSON.parse(atob(payload + "=".repeat((4 - (payload.length % 4)) % 4)));
    return claims.email || claims["cognito:username"] || claims.sub || "";
  } catch {
    return "";
  }
}

// where an API request goes and what is signed: with `apiUrl` (https://<id>.execute-api.<region>.amazonaws.com/
// <stage>) the execute-api host and the path with the stage prefix (API Gateway verifies the full path);
// without it (local) the page's own host and the path as it is
export function signingTarget(apiUrl, path, pageHost) {
  if (!apiUrl) return { url: path, host: pageHost, path };
  const base = new URL(apiUrl);
  const full = base.pathname.replace(/\/+$/, "") + path;
  return { url: `${base.origin}${full}`, host: base.host, path: full };
}
