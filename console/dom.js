// Building the page from Task data. Every string that comes from a Task
// (ids, messages, artifacts, metadata) is hostile input: it only ever
// becomes a Text node (createTextNode / textContent), never HTML.

/**
 * el("li", {class: "x", href: "#/"}, child...) -> a new element. Children
 * that are strings become Text nodes; null/undefined/false are skipped.
 * Attribute values are set with setAttribute (callers pass only fixed
 * names; an href is built by the caller from encodeURIComponent).
 */
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    e.append(typeof c === "string" ? document.createTextNode(c) : c);
  }
  return e;
}

/** Replaces the children of `e` with `children` (as el() takes them). */
export function fill(e, ...children) {
  e.replaceChildren();
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    e.append(typeof c === "string" ? document.createTextNode(c) : c);
  }
}

/** "TASK_STATE_INPUT_REQUIRED" -> "input-required" (unknown text as is). */
export function stateName(state) {
  if (typeof state !== "string") return "unknown";
  return state.startsWith("TASK_STATE_") ? state.slice(11).toLowerCase().replaceAll("_", "-") : state;
}

/** States that wait for a person. */
export function isWaiting(state) {
  const s = stateName(state);
  return s === "input-required" || s === "auth-required";
}

/** States no message can move on. */
export function isTerminal(state) {
  const s = stateName(state);
  return s === "completed" || s === "failed" || s === "canceled" || s === "rejected";
}

/** A state badge. */
export function stateBadge(state) {
  const s = stateName(state);
  return el("span", { class: "state " + s.replace(/[^a-z-]/g, "") }, s);
}

/** The text of a message's parts (text parts joined; others described). */
export function partsText(parts) {
  if (!Array.isArray(parts)) return "";
  return parts.map((p) => {
    if (p === null || typeof p !== "object") return "";
    if (typeof p.text === "string") return p.text;
    if (p.data !== undefined) return JSON.stringify(p.data, null, 2);
    if (p.file || p.url || p.raw !== undefined) {
      const f = p.file || p;
      return "[file " + String(f.name || f.filename || "") + " " + String(f.mediaType || f.mimeType || "") + " " +
        String(f.url || f.uri || "") + "]";
    }
    return JSON.stringify(p);
  }).join("\n");
}

/** One message: its role and its parts, as text. */
export function messageItem(m) {
  const role = typeof m.role === "string" ? m.role.replace(/^ROLE_/, "") : "";
  return el("li", {}, el("span", { class: "role" }, role), el("div", { class: "text" }, partsText(m.parts)));
}

/** A timestamp as local time (the text as it is when unreadable). */
export function when(ts) {
  if (typeof ts !== "string" || ts === "") return "";
  const d = new Date(ts);
  return Number.isNaN(d.getTime()) ? ts : d.toLocaleString();
}
