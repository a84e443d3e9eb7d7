// Server-sent events read from a fetch() body (EventSource can neither POST
// nor send Authorization), by the WHATWG HTML "event stream" rules: lines
// end in LF, CR or CRLF; a blank line dispatches; "id", "event" and "data"
// fields; ":" lines are comments (keep-alives).

/**
 * Reads `body` (a ReadableStream of bytes) and calls onEvent({id, event,
 * data}) for each event. Resolves when the stream ends; rejects when the
 * read fails (a dropped connection). `id` is the last id seen (null before
 * any), as Last-Event-ID resends it.
 */
export async function readEvents(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  let data = [];
  let event = "";
  let id = null;
  const line = (l) => {
    if (l === "") {
      if (data.length > 0) onEvent({ id, event: event || "message", data: data.join("\n") });
      data = [];
      event = "";
      return;
    }
    if (l.startsWith(":")) return;
    const colon = l.indexOf(":");
    const name = colon < 0 ? l : l.slice(0, colon);
    let value = colon < 0 ? "" : l.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "data") data.push(value);
    else if (name === "event") event = value;
    else if (name === "id" && !value.includes("\0")) id = value;
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let at;
    while ((at = buf.search(/\r\n|\r|\n/)) >= 0) {
      // A CR at the very end may be the first half of a CRLF: wait for more.
      if (buf[at] === "\r" && at === buf.length - 1) break;
      const len = buf.startsWith("\r\n", at) ? 2 : 1;
      line(buf.slice(0, at));
      buf = buf.slice(at + len);
    }
  }
  if (buf !== "") line(buf);
  return id;
}
