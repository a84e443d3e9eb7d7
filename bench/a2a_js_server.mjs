// bench/a2a_js_server.mjs: the peer of `toolnexus serve --agent echo --store
// memory` in bench/million.py's RSS row: the official A2A JS SDK's
// DefaultRequestHandler and InMemoryTaskStore behind its JSON-RPC transport
// (A2A v1.0, JSON-RPC at POST /) on node's own http module, with an echo
// agent that answers each message with a Task holding the message and an
// artifact of its text, completed. No express: only what the SDK itself needs.
//
//   node bench/a2a_js_server.mjs SDK_DIR
//
// SDK_DIR: the installed @a2a-js/sdk 1.x package (tests/clients installs it
// as BUILD_DIR/js-clients/node_modules/a2a-sdk-1). Listens on a free loopback
// port and prints "listening on http://127.0.0.1:PORT/" as its first line.
import http from 'node:http';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const sdkDir = process.argv[2];
if (!sdkDir) {
  console.error('usage: node a2a_js_server.mjs SDK_DIR');
  process.exit(2);
}
const sdk = await import(pathToFileURL(path.join(sdkDir, 'dist/server/index.js')).href);
const { AgentEvent, DefaultRequestHandler, InMemoryTaskStore, JsonRpcTransportHandler, ServerCallContext } = sdk;

const TASK_STATE_COMPLETED = 3;
const card = {
  name: 'a2a-js echo',
  description: 'echo agent for bench/million.py',
  version: '1.0.0',
  supportedInterfaces: [{ url: 'http://127.0.0.1/', protocolBinding: 'JSONRPC', protocolVersion: '1.0' }],
  capabilities: { streaming: false, pushNotifications: false },
  defaultInputModes: ['text/plain'],
  defaultOutputModes: ['text/plain'],
  skills: [],
};

const echo = {
  async execute(ctx, bus) {
    const msg = ctx.userMessage;
    const text = (msg.parts ?? []).map((p) => (p.content?.$case === 'text' ? p.content.value : '')).join('');
    bus.publish(AgentEvent.task({
      id: ctx.taskId,
      contextId: ctx.contextId,
      status: { state: TASK_STATE_COMPLETED, message: undefined, timestamp: new Date().toISOString() },
      artifacts: [{
        artifactId: 'echo', name: '', description: '', parts: [{ content: { $case: 'text', value: text } }],
        metadata: undefined, extensions: [],
      }],
      history: [msg],
      metadata: undefined,
    }));
    bus.finished();
  },
  async cancelTask() {},
};

const handler = new DefaultRequestHandler(card, new InMemoryTaskStore(), echo);
const rpc = new JsonRpcTransportHandler(handler);

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', async () => {
    let out;
    try {
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      const context = new ServerCallContext({ requestedVersion: req.headers['a2a-version'] ?? '1.0' });
      out = await rpc.handle(body, context);
    } catch (e) {
      out = { jsonrpc: '2.0', id: null, error: { code: -32603, message: String(e) } };
    }
    const text = JSON.stringify(out);
    res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) });
    res.end(text);
  });
});
server.keepAliveTimeout = 60000;
server.listen(0, '127.0.0.1', () => {
  console.log(`listening on http://127.0.0.1:${server.address().port}/`);
});
