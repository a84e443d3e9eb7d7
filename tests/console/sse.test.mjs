// The console's event-stream reader (console/sse.js) on byte streams cut
// anywhere: LF, CRLF and CR line ends (a CRLF split across two reads too),
// comments (keep-alives), multi-line data, an id kept until changed, an
// event without data not dispatched, and a last event cut off before its
// blank line dropped (WHATWG: pending data is discarded at the end).
// Env: TNX_CONSOLE_DIR (the console's source directory).
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { pathToFileURL } from "node:url";

const { readEvents } = await import(pathToFileURL(path.join(process.env.TNX_CONSOLE_DIR, "sse.js")).href);

// A ReadableStream of `text`'s UTF-8 bytes, in reads cut at `cuts`.
function stream(text, cuts) {
  const bytes = new TextEncoder().encode(text);
  const at = [0, ...cuts.filter((c) => c > 0 && c < bytes.length), bytes.length];
  let i = 0;
  return new ReadableStream({
    pull(controller) {
      if (i + 1 >= at.length) { controller.close(); return; }
      controller.enqueue(bytes.slice(at[i], at[i + 1]));
      i++;
    },
  });
}

async function events(text, cuts = []) {
  const got = [];
  await readEvents(stream(text, cuts), (e) => got.push(e));
  return got;
}

const wire = "id: 1\r\ndata: {\"task\":{}}\r\n\r\n: keep-alive\n\nid: 2\rdata: a\rdata: b\r\r" +
  "id: 3\nevent: error\ndata: {\"x\":\"é\"}\n\nid: 5\r\ndata: c\r\ndata: d\r\n\r\nid: 4\n\ndata: cut off";
const want = [
  { id: "1", event: "message", data: "{\"task\":{}}" },
  { id: "2", event: "message", data: "a\nb" },
  { id: "3", event: "error", data: "{\"x\":\"é\"}" },
  { id: "5", event: "message", data: "c\nd" },
];

test("whole, and cut at every byte: the same events", async () => {
  assert.deepEqual(await events(wire), want);
  const n = new TextEncoder().encode(wire).length;
  for (let cut = 1; cut < n; cut++) assert.deepEqual(await events(wire, [cut]), want, "cut at byte " + cut);
  assert.deepEqual(await events(wire, Array.from({ length: n }, (_, k) => k)), want, "one byte a read");
});

test("a CRLF split across two reads is one line end, not two", async () => {
  assert.deepEqual(await events("data: x\r\ndata: y\r\n\r\n", [8]), [{ id: null, event: "message", data: "x\ny" }]);
});
