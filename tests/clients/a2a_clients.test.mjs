// Real A2A clients against `toolnexus serve` (issues 9 and 10): the official JS SDK
// @a2a-js/sdk 1.x (protocol v1.0; the default ClientFactory, once on its
// JSON-RPC transport and once on HTTP+JSON) and 0.3.x (protocol v0.3,
// JSON-RPC). The server runs the `approval` agent; run.sh starts it on each
// store and sets:
//   TNX_URL    the server's base URL ("http://127.0.0.1:PORT")
//   TNX_PHASE  "flows" (default): every flow, for every client;
//              "park": leaves one input-required Task (id written to TNX_STATE_FILE);
//              "resume": after a restart, reads that Task and approves it.
// Run with node's test runner: node --test a2a_clients.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';

import { ClientFactory, ClientFactoryOptions, JsonRpcTransportFactory, RestTransportFactory } from 'a2a-sdk-1/client';
import { Message, TaskState, Role } from 'a2a-sdk-1';
import { ClientFactory as ClientFactory03, ClientFactoryOptions as ClientFactoryOptions03 } from 'a2a-sdk-0.3/client';

const base = process.env.TNX_URL;
assert.ok(base, 'TNX_URL must name the server');
const phase = process.env.TNX_PHASE ?? 'flows';
const run = `${process.pid}-${Date.now()}`;
let counter = 0;
const mid = () => `m-${run}-${++counter}`;

// ---------------------------------------------------------------------------
// One adapter per client, so every flow runs the same way on each.
// ---------------------------------------------------------------------------

const STATE_NAMES = {
  submitted: 'TASK_STATE_SUBMITTED', working: 'TASK_STATE_WORKING', 'input-required': 'TASK_STATE_INPUT_REQUIRED',
  completed: 'TASK_STATE_COMPLETED', canceled: 'TASK_STATE_CANCELED', rejected: 'TASK_STATE_REJECTED',
  failed: 'TASK_STATE_FAILED',
};

function v1Text(parts) {
  return parts.filter((p) => p.content?.$case === 'text').map((p) => p.content.value).join('\n');
}

// 1.x: Tasks come back decoded (numeric enums, oneof parts); normalised here
// to {id, contextId, state: 'TASK_STATE_*', history: [{role, text}], artifacts: [text], statusText}.
function fromV1(t) {
  return {
    id: t.id,
    contextId: t.contextId,
    state: TaskState[t.status.state],
    statusText: t.status.message ? v1Text(t.status.message.parts) : '',
    history: (t.history ?? []).map((m) => ({ role: Role[m.role], text: v1Text(m.parts) })),
    artifacts: (t.artifacts ?? []).map((a) => v1Text(a.parts)),
  };
}

function v03Text(parts) {
  return parts.filter((p) => p.kind === 'text').map((p) => p.text).join('\n');
}

function fromV03(t) {
  return {
    id: t.id,
    contextId: t.contextId,
    state: STATE_NAMES[t.status.state] ?? `?${t.status.state}`,
    statusText: t.status.message ? v03Text(t.status.message.parts) : '',
    history: (t.history ?? []).map((m) => ({ role: m.role === 'user' ? 'ROLE_USER' : 'ROLE_AGENT', text: v03Text(m.parts) })),
    artifacts: (t.artifacts ?? []).map((a) => v03Text(a.parts)),
  };
}

async function v1Client(transport, polling, url = base) {
  const options = ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    preferredTransports: [transport],
    clientConfig: { polling },
  });
  return new ClientFactory(options).createFromUrl(url);
}

async function makeV1(transport, url = base) {
  const blocking = await v1Client(transport, false, url);
  const polling = await v1Client(transport, true, url);
  const message = (text, extra = {}) =>
    Message.fromJSON({ messageId: mid(), role: 'ROLE_USER', parts: [{ text }], ...extra });
  const unwrap = (r) => fromV1(r.payload ? r.payload.value : r);
  return {
    name: `@a2a-js/sdk 1.x ${transport}`,
    raw: blocking,
    transportName: blocking.transport.constructor.name,
    send: async (text, { taskId, contextId, wait = true } = {}) =>
      unwrap(await (wait ? blocking : polling).sendMessage({ message: message(text, { taskId, contextId }) })),
    get: async (id, historyLength) => fromV1(await blocking.getTask({ id, historyLength })),
    cancel: async (id) => fromV1(await blocking.cancelTask({ id })),
    list: async (params) => {
      const r = await blocking.listTasks(params);
      return { tasks: r.tasks.map(fromV1), nextPageToken: r.nextPageToken, totalSize: r.totalSize, pageSize: r.pageSize };
    },
    // Streams, normalised to ['task:STATE' | 'status:STATE' | 'artifact:text'].
    stream: (text, { taskId, contextId } = {}) =>
      blocking.sendMessageStream({ message: message(text, { taskId, contextId }) }),
    resubscribe: (id) => blocking.resubscribeTask({ id }),
    event: (e) => {
      const p = e.payload;
      if (p.$case === 'task') return { what: `task:${TaskState[p.value.status.state]}`, id: p.value.id };
      if (p.$case === 'statusUpdate') return { what: `status:${TaskState[p.value.status.state]}`, id: p.value.taskId };
      if (p.$case === 'artifactUpdate')
        return { what: `artifact:${v1Text(p.value.artifact.parts)}`, id: p.value.taskId, append: p.value.append };
      return { what: p.$case };
    },
    push: {
      create: (taskId, url, token) => blocking.createTaskPushNotificationConfig({ taskId, url, token }),
      list: async (taskId) => (await blocking.listTaskPushNotificationConfig({ taskId })).configs,
      remove: (taskId, id) => blocking.deleteTaskPushNotificationConfig({ taskId, id }),
    },
  };
}

async function makeV03(url = base) {
  const options = ClientFactoryOptions03.createFrom(ClientFactoryOptions03.default, { preferredTransports: ['JSONRPC'] });
  const client = await new ClientFactory03(options).createFromUrl(url);
  const message = (text, extra) => ({ kind: 'message', messageId: mid(), role: 'user', parts: [{ kind: 'text', text }], ...extra });
  return {
    name: '@a2a-js/sdk 0.3.x JSONRPC',
    raw: client,
    transportName: client.transport.constructor.name,
    send: async (text, { taskId, contextId, wait = true } = {}) => {
      const extra = {};
      if (taskId) extra.taskId = taskId;
      if (contextId) extra.contextId = contextId;
      return fromV03(await client.sendMessage({ message: message(text, extra), configuration: { blocking: wait } }));
    },
    get: async (id, historyLength) => fromV03(await client.getTask({ id, historyLength })),
    cancel: async (id) => fromV03(await client.cancelTask({ id })),
    list: null,  // v0.3 has no ListTasks
    stream: (text, { taskId, contextId } = {}) => {
      const extra = {};
      if (taskId) extra.taskId = taskId;
      if (contextId) extra.contextId = contextId;
      return client.sendMessageStream({ message: message(text, extra) });
    },
    resubscribe: (id) => client.resubscribeTask({ id }),
    event: (e) => {
      if (e.kind === 'task') return { what: `task:${STATE_NAMES[e.status.state]}`, id: e.id };
      if (e.kind === 'status-update') return { what: `status:${STATE_NAMES[e.status.state]}`, id: e.taskId, final: e.final };
      if (e.kind === 'artifact-update') return { what: `artifact:${v03Text(e.artifact.parts)}`, id: e.taskId, append: e.append };
      return { what: e.kind };
    },
    push: {
      create: (taskId, url, token) =>
        client.setTaskPushNotificationConfig({ taskId, pushNotificationConfig: { url, token } }),
      list: async (taskId) => client.listTaskPushNotificationConfig({ id: taskId }),
      remove: (taskId, id) => client.deleteTaskPushNotificationConfig({ id: taskId, pushNotificationConfigId: id }),
    },
  };
}

async function collect(gen, c) {
  const out = [];
  for await (const e of gen) out.push(c.event(e));
  return out;
}

// A webhook on loopback that records what it is sent.
async function webhook() {
  const got = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (d) => { body += d; });
    req.on('end', () => {
      got.push({ type: req.headers['content-type'], token: req.headers['x-a2a-notification-token'], body: JSON.parse(body) });
      res.writeHead(200).end();
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { got, url: `http://127.0.0.1:${server.address().port}/hook`, close: () => server.close() };
}

async function streamFlows(c) {
  // sendMessageStream: the Task, then its states, until it is interrupted.
  const first = await collect(c.stream('stream this'), c);
  assert.deepEqual(first.map((e) => e.what),
    ['task:TASK_STATE_SUBMITTED', 'status:TASK_STATE_WORKING', 'status:TASK_STATE_INPUT_REQUIRED'], c.name);
  const id = first[0].id;
  assert.ok(first.every((e) => e.id === id));

  // resubscribeTask while another call approves: the snapshot, then the run.
  const sub = c.resubscribe(id);
  const it = sub[Symbol.asyncIterator]();
  const snap = c.event((await it.next()).value);
  assert.equal(snap.what, 'task:TASK_STATE_INPUT_REQUIRED', c.name);
  const approving = c.send('approve', { taskId: id });
  const rest = [];
  for (let r = await it.next(); !r.done; r = await it.next()) rest.push(c.event(r.value));
  assert.deepEqual(rest.map((e) => e.what),
    ['status:TASK_STATE_WORKING', 'artifact:stream this', 'status:TASK_STATE_COMPLETED'], c.name);
  assert.equal((await approving).state, 'TASK_STATE_COMPLETED');

  // Continuing a Task as a stream: the resumed Task, the artifact, completed.
  const second = await collect(c.stream('again'), c);
  const again = await collect(c.stream('yes', { taskId: second[0].id }), c);
  assert.deepEqual(again.map((e) => e.what),
    ['task:TASK_STATE_WORKING', 'artifact:again', 'status:TASK_STATE_COMPLETED'], c.name);

  // Push notifications to a local webhook.
  const hook = await webhook();
  try {
    const parked = await c.send('notify me');
    await c.push.create(parked.id, hook.url, 'tok');
    assert.equal((await c.push.list(parked.id)).length, 1);
    await c.send('approve', { taskId: parked.id });
    await eventually(async () => hook.got.length, (n) => n >= 1, 5000);
    await new Promise((r) => setTimeout(r, 300));
    assert.ok(hook.got.length >= 1, `${c.name}: the webhook got nothing`);
    assert.ok(hook.got.every((g) => g.token === 'tok'));
    const last = hook.got[hook.got.length - 1].body;
    const state = last.statusUpdate ? last.statusUpdate.status.state : last.status.state;
    assert.ok(state === 'TASK_STATE_COMPLETED' || state === 'completed', `${c.name}: ${JSON.stringify(last)}`);
  } finally {
    hook.close();
  }
}

async function eventually(read, accept, ms = 5000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await read();
    if (accept(v) || Date.now() > deadline) return v;
    await new Promise((r) => setTimeout(r, 20));
  }
}

// The error a call throws: its class name and, where the SDK keeps it, the
// JSON-RPC code.
async function failure(promise) {
  try {
    await promise;
  } catch (e) {
    return { name: e.name, code: e.envelopeCode ?? e.code, message: e.message };
  }
  assert.fail('the call was expected to fail');
}

// ---------------------------------------------------------------------------
// Flows
// ---------------------------------------------------------------------------

async function flows(c) {
  // Blocking send: answered when the approval agent parks the Task.
  const t = await c.send('deploy release 1.4');
  assert.equal(t.state, 'TASK_STATE_INPUT_REQUIRED', `${c.name}: blocking send`);
  assert.match(t.statusText, /Approval required for: "deploy release 1.4"/);
  assert.equal(t.id.length, 36, 'the server chooses the Task id');
  assert.deepEqual(t.history.map((m) => m.role), ['ROLE_USER', 'ROLE_AGENT']);

  // Non-blocking send: answered at once with the Task as created.
  const nb = await c.send('later', { wait: false });
  assert.equal(nb.state, 'TASK_STATE_SUBMITTED', `${c.name}: non-blocking send`);
  const parked = await eventually(() => c.get(nb.id), (x) => x.state === 'TASK_STATE_INPUT_REQUIRED');
  assert.equal(parked.state, 'TASK_STATE_INPUT_REQUIRED');

  // historyLength 0 and N.
  assert.deepEqual((await c.get(t.id, 0)).history, []);
  const last = await c.get(t.id, 1);
  assert.equal(last.history.length, 1);
  assert.equal(last.history[0].role, 'ROLE_AGENT');
  assert.equal((await c.get(t.id)).history.length, 2);

  // Multi-turn on the same Task id: an unclear answer asks again, approve completes.
  const again = await c.send('hmm', { taskId: t.id, contextId: t.contextId });
  assert.equal(again.id, t.id);
  assert.equal(again.state, 'TASK_STATE_INPUT_REQUIRED');
  assert.match(again.statusText, /Please answer/);
  const done = await c.send('approve', { taskId: t.id });
  assert.equal(done.id, t.id);
  assert.equal(done.state, 'TASK_STATE_COMPLETED');
  assert.deepEqual(done.artifacts, ['deploy release 1.4']);
  assert.equal(done.history.length, 6);

  // Cancel: input-required -> canceled; completed -> TaskNotCancelable.
  const canceled = await c.cancel(nb.id);
  assert.equal(canceled.state, 'TASK_STATE_CANCELED');
  assert.equal((await c.get(nb.id)).state, 'TASK_STATE_CANCELED');
  const nc = await failure(c.cancel(t.id));
  assert.equal(nc.name, 'TaskNotCancelableError', `${c.name}: ${JSON.stringify(nc)}`);
  // A message to a terminal Task: UnsupportedOperation.
  const closed = await failure(c.send('approve', { taskId: nb.id }));
  assert.equal(closed.name, 'UnsupportedOperationError', `${c.name}: ${JSON.stringify(closed)}`);

  // Unknown id: TaskNotFound.
  const nf = await failure(c.get('no-such-task'));
  assert.equal(nf.name, 'TaskNotFoundError', `${c.name}: ${JSON.stringify(nf)}`);
  const nfc = await failure(c.cancel('no-such-task'));
  assert.equal(nfc.name, 'TaskNotFoundError');

  if (c.list) {
    // Three Tasks in a fresh context; two pages of two, then a state filter.
    const ctx = `ctx-${run}-${c.transportName}`;
    const ids = [];
    for (let i = 0; i < 3; ++i) ids.push((await c.send(`job ${i}`, { contextId: ctx })).id);
    const done2 = await c.send('yes', { taskId: ids[0] });
    assert.equal(done2.state, 'TASK_STATE_COMPLETED');
    const p1 = await c.list({ contextId: ctx, pageSize: 2 });
    assert.equal(p1.tasks.length, 2);
    assert.equal(p1.totalSize, 3);
    assert.equal(p1.pageSize, 2);
    assert.notEqual(p1.nextPageToken, '');
    const p2 = await c.list({ contextId: ctx, pageSize: 2, pageToken: p1.nextPageToken });
    assert.equal(p2.tasks.length, 1);
    assert.equal(p2.nextPageToken, '');
    assert.deepEqual(new Set([...p1.tasks, ...p2.tasks].map((x) => x.id)), new Set(ids));
    // Newest status first: the completed one was changed last.
    assert.equal(p1.tasks[0].id, ids[0]);
    const waiting = await c.list({ contextId: ctx, status: TaskState.TASK_STATE_INPUT_REQUIRED });
    assert.deepEqual(new Set(waiting.tasks.map((x) => x.id)), new Set(ids.slice(1)));
    assert.equal(waiting.totalSize, 2);
    // Artifacts only on request.
    const noArt = await c.list({ contextId: ctx, status: TaskState.TASK_STATE_COMPLETED });
    assert.deepEqual(noArt.tasks[0].artifacts, []);
    const withArt = await c.list({ contextId: ctx, status: TaskState.TASK_STATE_COMPLETED, includeArtifacts: true });
    assert.deepEqual(withArt.tasks[0].artifacts, ['job 0']);
  }
}

// A 1.x client whose transport loses the answer of its first SendMessage:
// the request reaches the server and is carried out, then the client sees a
// timeout. @a2a-js/sdk 1.3.0 does not retry a send itself (its only resend is
// createAuthenticatingFetchWithRetry's, after an auth challenge), so the
// application retries through the SDK with the same Message, the same
// messageId (issue 22 item 2).
async function lossyV1(transport) {
  let lose = 0;
  const fetchImpl = async (url, init) => {
    const r = await fetch(url, init);
    if (init?.method === 'POST' && lose > 0) {
      lose--;
      await r.arrayBuffer();
      throw new DOMException('the answer was lost (test)', 'TimeoutError');
    }
    return r;
  };
  const options = ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    transports: [new JsonRpcTransportFactory({ fetchImpl }), new RestTransportFactory({ fetchImpl })],
    preferredTransports: [transport],
  });
  const client = await new ClientFactory(options).createFromUrl(base);
  return { client, loseNext: () => { lose = 1; } };
}

async function retriedSend(transport) {
  const { client, loseNext } = await lossyV1(transport);
  const msg = Message.fromJSON({ messageId: mid(), role: 'ROLE_USER', parts: [{ text: 'pay invoice 77' }] });
  loseNext();
  await assert.rejects(client.sendMessage({ message: msg }), /lost/);
  const unwrap = (x) => fromV1(x.payload ? x.payload.value : x);
  const r = unwrap(await client.sendMessage({ message: msg }));
  assert.equal(r.state, 'TASK_STATE_INPUT_REQUIRED');
  assert.deepEqual(r.history.map((m) => m.role), ['ROLE_USER', 'ROLE_AGENT'], 'one turn, not two');
  const same = await client.listTasks({ contextId: r.contextId });
  assert.equal(same.tasks.length, 1, 'one Task for the two sends');
  assert.equal(same.tasks[0].id, r.id);

  // The approval, retried after its answer is lost: one approval, one artifact.
  const approve = Message.fromJSON({ messageId: mid(), role: 'ROLE_USER', taskId: r.id, parts: [{ text: 'approve' }] });
  loseNext();
  await assert.rejects(client.sendMessage({ message: approve }), /lost/);
  const done = unwrap(await client.sendMessage({ message: approve }));
  assert.equal(done.id, r.id);
  assert.equal(done.state, 'TASK_STATE_COMPLETED');
  assert.deepEqual(done.artifacts, ['pay invoice 77']);
  assert.equal(done.history.filter((m) => m.role === 'ROLE_USER').length, 2, 'the retried approval is one message');
}

if (phase === 'flows') {
  test('card discovery: the 1.x ClientFactory picks v1.0 JSON-RPC by default, HTTP+JSON when preferred', async () => {
    const byDefault = await new ClientFactory().createFromUrl(base);
    assert.match(byDefault.transport.constructor.name, /JsonRpcTransport/);
    assert.equal(byDefault.protocolVersion, '1.0');
    const card = await byDefault.getAgentCard();
    assert.deepEqual(card.supportedInterfaces.map((i) => `${i.protocolBinding} ${i.protocolVersion}`),
      ['JSONRPC 1.0', 'HTTP+JSON 1.0', 'JSONRPC 0.3']);
    const rest = await makeV1('HTTP+JSON');
    assert.match(rest.transportName, /RestTransport/);
    const old = await makeV03();
    assert.match(old.transportName, /JsonRpcTransport/);
  });
  test('@a2a-js/sdk 1.x over JSON-RPC: every flow', async () => flows(await makeV1('JSONRPC')));
  test('@a2a-js/sdk 1.x over HTTP+JSON: every flow', async () => flows(await makeV1('HTTP+JSON')));
  test('@a2a-js/sdk 0.3.x over JSON-RPC: every flow', async () => flows(await makeV03()));
  test('@a2a-js/sdk 1.x over JSON-RPC: a send retried after its answer was lost makes one Task', async () => retriedSend('JSONRPC'));
  test('@a2a-js/sdk 1.x over HTTP+JSON: a send retried after its answer was lost makes one Task', async () => retriedSend('HTTP+JSON'));
  test('@a2a-js/sdk 1.x over JSON-RPC: streams and push notifications', async () => streamFlows(await makeV1('JSONRPC')));
  test('@a2a-js/sdk 1.x over HTTP+JSON: streams and push notifications', async () => streamFlows(await makeV1('HTTP+JSON')));
  test('@a2a-js/sdk 0.3.x over JSON-RPC: streams and push notifications', async () => streamFlows(await makeV03()));
  test('a Task written by one client version reads right through the other', async () => {
    const v1 = await makeV1('HTTP+JSON');
    const v03 = await makeV03();
    const t = await v1.send('cross over');
    const seen = await v03.get(t.id);
    assert.equal(seen.state, 'TASK_STATE_INPUT_REQUIRED');
    assert.deepEqual(seen.history, t.history);
    const done = await v03.send('approve', { taskId: t.id });
    assert.equal(done.state, 'TASK_STATE_COMPLETED');
    const back = await v1.get(t.id);
    assert.deepEqual(back, done);
  });
} else if (phase === 'park') {
  test('park: a Task left in input-required before the server is killed', async () => {
    const c = await makeV1('JSONRPC');
    const t = await c.send('survive the restart');
    assert.equal(t.state, 'TASK_STATE_INPUT_REQUIRED');
    writeFileSync(process.env.TNX_STATE_FILE, t.id);
  });
} else if (phase === 'resume') {
  test('resume: after a restart the Task is still input-required and is approved', async () => {
    const id = readFileSync(process.env.TNX_STATE_FILE, 'utf8').trim();
    const old = await makeV03();
    const seen = await old.get(id);
    assert.equal(seen.state, 'TASK_STATE_INPUT_REQUIRED');
    assert.match(seen.statusText, /survive the restart/);
    const rest = await makeV1('HTTP+JSON');
    const done = await rest.send('approve', { taskId: id });
    assert.equal(done.state, 'TASK_STATE_COMPLETED');
    assert.deepEqual(done.artifacts, ['survive the restart']);
  });
} else if (phase === 'replicas') {
  // Two replicas on one store (TNX_URL and TNX_URL_B): a stream opened on one
  // ends with the cancel made through the other (issue 20: the store's change
  // feed carries it; with the default 200 ms stream poll as the fallback).
  const other = process.env.TNX_URL_B;
  assert.ok(other, 'TNX_URL_B must name the second replica');
  for (const [label, make] of [['1.x JSON-RPC', (u) => makeV1('JSONRPC', u)], ['1.x HTTP+JSON', (u) => makeV1('HTTP+JSON', u)],
    ['0.3.x JSON-RPC', (u) => makeV03(u)]]) {
    test(`${label}: stream from one replica, cancel through the other`, async () => {
      const a = await make(base);
      const b = await make(other);
      const parked = await a.send('wait for me');
      assert.equal(parked.state, 'TASK_STATE_INPUT_REQUIRED');
      const it = a.resubscribe(parked.id)[Symbol.asyncIterator]();
      assert.equal(a.event((await it.next()).value).what, 'task:TASK_STATE_INPUT_REQUIRED');
      const t0 = Date.now();
      const canceled = await b.cancel(parked.id);
      assert.equal(canceled.state, 'TASK_STATE_CANCELED');
      const rest = [];
      for (let r = await it.next(); !r.done; r = await it.next()) rest.push(a.event(r.value).what);
      assert.deepEqual(rest, ['status:TASK_STATE_CANCELED']);
      console.log(`${label}: the stream on replica A ended ${Date.now() - t0} ms after the cancel sent to B`);
      assert.equal((await a.get(parked.id)).state, 'TASK_STATE_CANCELED');
    });
  }
} else {
  throw new Error(`unknown TNX_PHASE '${phase}'`);
}
