// AWS Signature Version 4 for API Gateway (service execute-api) with the browser's Web Crypto API.
// Signs host, x-amz-date, x-amz-content-sha256 (the SHA-256 of the body, always) and, with temporary
// credentials, x-amz-security-token. The query string is sent exactly as it is signed (canonicalQuery).

const enc = new TextEncoder();

function hex(buf) {
  return Array.from(new Uint8Array(buf), (b) => b.toString(16).padStart(2, "0")).join("");
}

export async function sha256Hex(data) {
  const bytes = typeof data === "string" ? enc.encode(data) : data;
  return hex(await crypto.subtle.digest("SHA-256", bytes));
}

async function hmac(key, msg) {
  const raw = typeof key === "string" ? enc.encode(key) : key;
  const k = await crypto.subtle.importKey("raw", raw, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  return crypto.subtle.sign("HMAC", k, enc.encode(msg));
}

// RFC 3986 percent-encoding of everything but the unreserved characters (A-Z a-z 0-9 - . _ ~).
export function uriEncode(s) {
  return encodeURIComponent(s).replace(/[!'()*]/g, (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase());
}

// [[key, value], ...] -> the canonical (and sent) query string: encoded pairs sorted by key, then value.
export function canonicalQuery(pairs) {
  const cmp = (a, b) => (a < b ? -1 : a > b ? 1 : 0);
  return pairs
    .map(([k, v]) => [uriEncode(String(k)), uriEncode(String(v))])
    .sort((a, b) => cmp(a[0], b[0]) || cmp(a[1], b[1]))
    .map(([k, v]) => `${k}=${v}`)
    .join("&");
}

export function amzDate(now = new Date()) {
  return now.toISOString().replace(/[-:]/g, "").replace(/\.\d{3}/, "");
}

// Returns the headers to send: x-amz-date, x-amz-content-sha256, [x-amz-security-token], authorization.
// `path` is the encoded path, `query` the canonical query string, `host` what the browser sends as Host.
export async function sign({ method, host, path, query = "", body = "", credentials, region, service, now }) {
  const date = amzDate(now);
  const day = date.slice(0, 8);
  const payloadHash = await sha256Hex(body);
  const headers = { host, "x-amz-content-sha256": payloadHash, "x-amz-date": date };
  if (credentials.session_token) headers["x-amz-security-token"] = credentials.session_token;
  const names = Object.keys(headers).sort();
  const canonicalHeaders = names.map((n) => `${n}:${String(headers[n]).trim()}\n`).join("");
  const signedHeaders = names.join(";");
  // the canonical URI encodes each segment of the (already encoded) path once more, as AWS does
  const canonicalUri = path.split("/").map(uriEncode).join("/");
  const canonical = [method.toUpperCase(), canonicalUri, query, canonicalHeaders, signedHeaders, payloadHash].join("\n");
  const scope = `${day}/${region}/${service}/aws4_request`;
  const toSign = ["AWS4-HMAC-SHA256", date, scope, await sha256Hex(canonical)].join("\n");
  let key = await hmac("AWS4" + credentials.secret_access_key, day);
  for (const part of [region, service, "aws4_request"]) key = await hmac(key, part);
  const signature = hex(await hmac(key, toSign));
  const out = { ...headers };
  delete out.host;
  out.authorization =
    `AWS4-HMAC-SHA256 Credential=${credentials.access_key_id}/${scope}, ` +
    `SignedHeaders=${signedHeaders}, Signature=${signature}`;
  return out;
}
