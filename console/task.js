// One Task: status, the pending question, actions (approve / deny with a
// comment, cancel), artifacts and history, kept live by the server's own
// SubscribeToTask stream (read with fetch, resumed with Last-Event-ID when
// the connection drops).
import { ApiError, cancelTask, getTask, openStream, sendOnTask } from "./api.js";
import { readEvents } from "./sse.js";
import { el, fill, isTerminal, isWaiting, messageItem, partsText, stateBadge, stateName, when } from "./dom.js";

const MAX_BACKOFF_MS = 10000;

let cur = null;  // the open Task: {id, task, lastEventId, abort, closed, parts: {...}}

const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  signal.addEventListener("abort", () => { clearTimeout(t); resolve(); }, { once: true });
});

// The llm agent's approval prompt: "... wants to call NAME with ARGS. Reply ...".
function toolCall(text) {
  const m = /wants to call (\S+) with ([\s\S]*)\. Reply "approve"/.exec(text);
  if (!m) return null;
  let args = m[2];
  try { args = JSON.stringify(JSON.parse(args), null, 2); } catch { /* shown as sent */ }
  return { name: m[1], args };
}

function skeleton(c) {
  const p = {
    head: el("div", { class: "task-head" }),
    meta: el("p", { class: "meta" }),
    question: el("div", { class: "question", hidden: true }),
    comment: el("textarea", { id: "comment", placeholder: "Comment (optional): sent with approve or deny", maxlength: "4000" }),
    approve: el("button", { type: "button", class: "approve", id: "approve" }, "Approve"),
    deny: el("button", { type: "button", class: "deny", id: "deny" }, "Deny"),
    cancel: el("button", { type: "button", class: "cancel", id: "cancel" }, "Cancel Task"),
    outcome: el("p", { class: "result", id: "outcome", role: "status" }),
    artifacts: el("div", { id: "artifacts" }),
    history: el("ol", { class: "messages", id: "history" }),
  };
  p.actions = el("div", { class: "actions" }, p.comment, p.approve, p.deny, p.cancel);
  p.approve.addEventListener("click", () => answer(c, "approve"));
  p.deny.addEventListener("click", () => answer(c, "deny"));
  p.cancel.addEventListener("click", () => cancel(c));
  c.parts = p;
  return [p.head, p.meta, p.question, p.actions, p.outcome, el("h3", {}, "Artifacts"), p.artifacts,
    el("h3", {}, "History"), p.history];
}

function render(c) {
  const t = c.task;
  const p = c.parts;
  if (!t || !p) return;
  const state = t.status ? t.status.state : "";
  const statusText = t.status && t.status.message ? partsText(t.status.message.parts) : "";
  fill(p.head, el("h2", {}, String(t.id)), stateBadge(state), el("span", { class: "live " + c.live.cls, id: "live" }, c.live.text));
  fill(p.meta, "contextId " + String(t.contextId || ""), " · ", when(t.status && t.status.timestamp));
  if (isWaiting(state)) {
    const call = toolCall(statusText);
    fill(p.question, el("h3", {}, stateName(state) === "auth-required" ? "Authorization required" : "Waiting for you"),
      call ? el("p", {}, "The agent wants to call ", el("span", { class: "tool" }, call.name), " with:") : null,
      call ? el("pre", { class: "args" }, call.args) : null,
      el("div", { class: "text prompt" }, statusText));
    p.question.hidden = false;
    fill(p.outcome);
  } else {
    p.question.hidden = true;
    fill(p.outcome, statusText ? stateName(state) + ": " + statusText : "");
  }
  const busy = c.busy;
  p.approve.disabled = p.deny.disabled = busy || !isWaiting(state);
  p.comment.disabled = busy || !isWaiting(state);
  p.cancel.disabled = busy || isTerminal(state);
  const arts = Array.isArray(t.artifacts) ? t.artifacts : [];
  fill(p.artifacts, ...(arts.length ? arts.map((a) => el("div", { class: "artifact" },
    el("div", { class: "name" }, String(a.name || a.artifactId || "")),
    el("div", { class: "text" }, partsText(a.parts)))) : [el("p", { class: "meta" }, "None yet.")]));
  const hist = Array.isArray(t.history) ? t.history : [];
  fill(p.history, ...hist.map(messageItem));
}

function setLive(c, cls, text) {
  c.live = { cls, text };
  const e = document.getElementById("live");
  if (e && c === cur) { e.className = "live " + cls; e.textContent = text; }
}

// Applies one StreamResponse ({task} | {statusUpdate} | {artifactUpdate}).
function apply(c, r) {
  if (r.task) { c.task = r.task; return; }
  const t = c.task;
  if (!t) return;
  if (r.statusUpdate && r.statusUpdate.status) {
    t.status = r.statusUpdate.status;
    const m = t.status.message;
    if (m) {
      t.history = Array.isArray(t.history) ? t.history : [];
      if (!t.history.some((h) => h.messageId && h.messageId === m.messageId)) t.history.push(m);
    }
  } else if (r.artifactUpdate && r.artifactUpdate.artifact) {
    const a = r.artifactUpdate.artifact;
    t.artifacts = Array.isArray(t.artifacts) ? t.artifacts : [];
    const i = t.artifacts.findIndex((x) => x.artifactId === a.artifactId);
    if (i < 0) t.artifacts.push(a);
    else if (r.artifactUpdate.append) t.artifacts[i] = { ...t.artifacts[i], parts: [...(t.artifacts[i].parts || []), ...(a.parts || [])] };
    else t.artifacts[i] = a;
  }
}

// Whether `t` (an API answer) is at least as new as the Task shown: an
// answer that comes back after the stream already showed later events must
// not take the page back.
function notOlder(t, shown) {
  if (!shown || !shown.status || !t.status) return true;
  const a = Date.parse(t.status.timestamp);
  const b = Date.parse(shown.status.timestamp);
  return Number.isNaN(a) || Number.isNaN(b) || a >= b;
}

async function resync(c) {
  const t = await getTask(c.id, c.abort.signal);
  if (!c.closed) { c.task = t; render(c); }
}

// Follows the Task's stream until it is terminal or the view closes.
async function follow(c) {
  let delay = 500;
  while (!c.closed) {
    if (c.task && isTerminal(c.task.status && c.task.status.state)) {
      setLive(c, "", "ended");
      return;
    }
    let events = 0;
    try {
      const res = await openStream(c.id, c.lastEventId, c.abort.signal);
      setLive(c, "on", "live");
      await readEvents(res.body, (ev) => {
        if (ev.id !== null) c.lastEventId = ev.id;
        events++;
        if (ev.event === "error") return;
        try { apply(c, JSON.parse(ev.data)); } catch { return; }
        render(c);
      });
      if (c.closed) return;
      // The stream ended: the Task stopped (parked again or finished).
      await resync(c);
      if (events > 0) { delay = 500; continue; }
    } catch (e) {
      if (c.closed) return;
      if (e instanceof ApiError && (e.status === 401 || e.status === 403 || e.status === 404)) {
        setLive(c, "", "stopped: " + e.message);
        return;
      }
      if (e instanceof ApiError) {
        // Subscribing to a Task that just ended, e.g.: read it as it is.
        try { await resync(c); } catch { /* retried below */ }
        if (c.task && isTerminal(c.task.status && c.task.status.state)) continue;
      }
      setLive(c, "", "reconnecting" + (c.lastEventId !== null ? " (after event " + c.lastEventId + ")" : "") + "…");
    }
    await sleep(delay, c.abort.signal);
    delay = Math.min(delay * 2, MAX_BACKOFF_MS);
  }
}

async function answer(c, verb) {
  const comment = c.parts.comment.value.trim();
  c.busy = true;
  render(c);
  try {
    const r = await sendOnTask(c.task, comment ? verb + ": " + comment : verb);
    if (!c.closed && r && r.task) {
      if (notOlder(r.task, c.task)) c.task = r.task;
      c.parts.comment.value = "";
    }
  } catch (e) {
    c.onError(e);
  } finally {
    c.busy = false;
    render(c);
  }
}

async function cancel(c) {
  c.busy = true;
  render(c);
  try {
    const t = await cancelTask(c.id);
    if (!c.closed && t && t.id && notOlder(t, c.task)) c.task = t;
  } catch (e) {
    c.onError(e);
  } finally {
    c.busy = false;
    render(c);
  }
}

/** Shows Task `id` in `into` and follows it live; closes the one shown before. */
export async function openTask(id, into, onError) {
  closeTask();
  const c = { id, task: null, lastEventId: null, abort: new AbortController(), closed: false, busy: false,
    live: { cls: "", text: "loading…" }, onError };
  cur = c;
  fill(into, ...skeleton(c));
  try {
    c.task = await getTask(id, c.abort.signal);
  } catch (e) {
    if (!c.closed) { fill(into, el("p", { class: "notice" }, "Task " + id + ": " + e.message)); }
    return;
  }
  if (c.closed) return;
  render(c);
  follow(c);
}

/** Closes the open Task (its stream too). */
export function closeTask() {
  if (!cur) return;
  cur.closed = true;
  cur.abort.abort();
  cur = null;
}
