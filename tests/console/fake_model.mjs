// A stand-in for an OpenAI-compatible chat/completions endpoint: asks for
// the `authorize` tool with the user's text as its action until a tool
// result is in the conversation, then answers "Deployed (the tool said:
// <result>)." Keeps every request it was sent, for the test to read.
import http from "node:http";

/** Starts the model on a free loopback port: {url, requests, close()}. */
export async function startFakeModel() {
  const requests = [];
  const server = http.createServer((req, res) => {
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (c) => { body += c; });
    req.on("end", () => {
      let parsed;
      try { parsed = JSON.parse(body); } catch { res.writeHead(400).end(); return; }
      requests.push(parsed);
      const last = parsed.messages[parsed.messages.length - 1];
      const message = last.role === "tool"
        ? { role: "assistant", content: "Deployed (the tool said: " + last.content + ")." }
        : { role: "assistant", content: null, tool_calls: [{ id: "c" + requests.length, type: "function",
            function: { name: "authorize", arguments: JSON.stringify({ action: last.content }) } }] };
      const out = JSON.stringify({ choices: [{ index: 0, message, finish_reason: "stop" }] });
      res.writeHead(200, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(out) });
      res.end(out);
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { url: "http://127.0.0.1:" + server.address().port + "/v1", requests,
    close: () => new Promise((resolve) => server.close(resolve)) };
}
