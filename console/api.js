// The server's public A2A HTTP+JSON API (v1.0), called with the user's
// bearer token. The token lives in this module's memory only: never in
// localStorage, sessionStorage or a cookie, so it is gone with the tab.

let token = "";

/** Sets the bearer token ("" = none: a server without authentication). */
export function setToken(t) { token = t; }
/** Whether a token is set. */
export function hasToken() { return token !== ""; }

/** An API error: HTTP status and the server's message. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** The request headers every API call sends. */
export function headers(extra = {}) {
  const h = { "A2A-Version": "1.0", ...extra };
  if (token !== "") h.Authorization = "Bearer " + token;
  return h;
}

// The error text of a failed answer: the A2A error's message when the body
// is one ({"error": {"message"}} on HTTP+JSON, {"message"} elsewhere).
async function failure(res) {
  let text = "";
  try { text = await res.text(); } catch { /* the body is lost: the status says enough */ }
  let message = text.slice(0, 500);
  try {
    const j = JSON.parse(text);
    if (j && typeof j.error === "object" && j.error !== null && typeof j.error.message === "string") message = j.error.message;
    else if (j && typeof j.message === "string") message = j.message;
  } catch { /* not JSON: the text as it is */ }
  if (res.status === 401) message = "the server refused the token (401): sign in with a valid bearer token";
  return new ApiError(res.status, message || res.statusText);
}

async function call(method, path, body, signal) {
  const init = { method, headers: headers(), signal, cache: "no-store", credentials: "omit" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  if (!res.ok) throw await failure(res);
  return res.json();
}

/** ListTasks: GET /tasks. `q`: {status, contextId, pageSize, pageToken}. */
export function listTasks(q, signal) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) if (v !== undefined && v !== "") p.set(k, String(v));
  p.set("historyLength", "0");
  return call("GET", "/tasks?" + p.toString(), undefined, signal);
}

/** GetTask: GET /tasks/{id}. */
export function getTask(id, signal) {
  return call("GET", "/tasks/" + encodeURIComponent(id), undefined, signal);
}

/** CancelTask: POST /tasks/{id}:cancel. */
export function cancelTask(id) {
  return call("POST", "/tasks/" + encodeURIComponent(id) + ":cancel", undefined);
}

// A random message id (crypto.randomUUID needs a secure context; this does not).
function messageId() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  return "console-" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

/** SendMessage on an existing Task: POST /message:send, answered at once. */
export function sendOnTask(task, text) {
  const message = { messageId: messageId(), role: "ROLE_USER", taskId: task.id, parts: [{ text }] };
  if (task.contextId) message.contextId = task.contextId;
  return call("POST", "/message:send", { message, configuration: { returnImmediately: true } });
}

/** Opens SubscribeToTask: POST /tasks/{id}:subscribe, with Last-Event-ID when resuming. */
export async function openStream(id, lastEventId, signal) {
  const extra = { Accept: "text/event-stream" };
  if (lastEventId !== null && lastEventId !== undefined) extra["Last-Event-ID"] = String(lastEventId);
  const res = await fetch("/tasks/" + encodeURIComponent(id) + ":subscribe",
    { method: "POST", headers: headers(extra), signal, cache: "no-store", credentials: "omit" });
  if (!res.ok) throw await failure(res);
  return res;
}
