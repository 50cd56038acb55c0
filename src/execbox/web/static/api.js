// The console's only link to the server. The admin token the user typed lives in this tab's
// sessionStorage (gone when the tab closes) and is sent as a bearer header; it is never put
// in the DOM, a URL or localStorage.

const KEY = "execbox.console.token";

export class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || "";
    this.details = e.details || {};
  }
}

export const auth = {
  get: () => sessionStorage.getItem(KEY),
  set: (token) => sessionStorage.setItem(KEY, token),
  clear: () => sessionStorage.removeItem(KEY),
  onRejected: () => {},
};

function headers(extra = {}) {
  const out = { ...extra };
  const token = auth.get();
  if (token) out.Authorization = `Bearer ${token}`;
  return out;
}

async function failure(res, stored = true) {
  let body = null;
  try { body = await res.json(); } catch { /* not JSON */ }
  const err = new ApiError(res.status, body);
  if (!body || !body.error) err.message = `${res.status} ${res.statusText || "error"} from the server`;
  if (res.status === 401 && stored) auth.onRejected(err);  // the saved token stopped working
  return err;
}

/** JSON request; resolves to the parsed body, rejects with ApiError (SB code, details). */
export async function api(method, path, body, { token } = {}) {
  const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }) };
  if (token) init.headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) init.body = JSON.stringify(body);
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, { error: { code: "", message: `cannot reach the server: ${e.message}` } });
  }
  if (!res.ok) throw await failure(res, !token);
  return res.status === 204 ? null : res.json();
}

/**
 * POST and read server-sent events as they arrive (fetch + ReadableStream: EventSource cannot
 * send an Authorization header). Calls onEvent(name, data) per event; resolves when the stream ends.
 */
export async function stream(path, body, onEvent, signal) {
  const res = await fetch(path, {
    method: "POST", signal,
    headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
    body: JSON.stringify(body),
  });
  if (!res.ok) throw await failure(res);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value.replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      dispatch(frame, onEvent);
    }
  }
  if (buffer.trim()) dispatch(buffer, onEvent);
}

function dispatch(frame, onEvent) {
  let event = "message";
  const data = [];
  for (const line of frame.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length) return;
  let parsed = data.join("\n");
  try { parsed = JSON.parse(parsed); } catch { /* plain text data */ }
  onEvent(event, parsed);
}

/** Raster image types the console shows inline. Everything else a box produces (SVG, HTML,
 * XML, PDF, ...) can carry script: as a blob: URL it would run in the console's origin if opened
 * as a document, so it is only ever offered for download. */
export const INLINE_IMAGE_TYPES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);

/** The type a blob of box-made bytes may carry: an allow-listed raster image type, else
 * application/octet-stream (a download, never an active document). The box chooses mime_type. */
export function safeBlobType(type) {
  const base = String(type || "").split(";")[0].trim().toLowerCase();
  return INLINE_IMAGE_TYPES.has(base) ? base : "application/octet-stream";
}

/** base64 -> Blob, typed by safeBlobType (never a scriptable type). */
export function blobFromBase64(b64, type) {
  const raw = atob(b64);
  const buf = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i += 1) buf[i] = raw.charCodeAt(i);
  return new Blob([buf], { type: safeBlobType(type) });
}
