// The approval console in Debian's chromium (headless, via puppeteer-core)
// against `toolnexus serve --console --agent llm` on a file: store, with a
// fake model (fake_model.mjs) and a bearer token:
//   - a Task parks on `authorize`: the list shows it without a reload, the
//     Task view shows the tool call; approve -> the model's answer shows;
//   - a Task whose text is an <img onerror> renders as text: no element is
//     made of it and no script runs;
//   - deny with the comment "not today": the model is sent that comment;
//   - cancel a parked Task; the stream survives a server restart (it
//     reconnects with Last-Event-ID);
//   - the page breaks no Content-Security-Policy rule and keeps the token
//     in memory only.
// Screenshots of the list, a parked Task and a phone-width screen go to
// TNX_SHOTS (docs/console/, shown by docs/console.md).
// Env: TNX_BIN (the toolnexus program), TNX_CHROMIUM, TNX_SHOTS.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import puppeteer from "puppeteer-core";
import { startFakeModel } from "./fake_model.mjs";
import { startServe, stopServe } from "./serve.mjs";

const TOKEN = "console-test-token";
const WAIT = { timeout: 20000, polling: 100 };
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "toolnexus-console-"));
let model, server, base, browser, page;
const problems = [];      // page errors and CSP violations
const subscribes = [];    // request headers of every SubscribeToTask the page sent

// Starts the server (port 0 = a free one); resolves with {proc, url}.
function startServer(port) {
  return startServe(["--config", path.join(tmp, "serve.json"), "--listen", "127.0.0.1:" + port, "--console",
    "--auth-tokens", path.join(tmp, "tokens.json"), "--drain-timeout-ms", "200", "--stream-keepalive-ms", "1000"],
  { ...process.env, DEMO_API_KEY: "not-a-real-key" });
}

const stopServer = stopServe;

async function api(method, p, body) {
  const headers = { Authorization: "Bearer " + TOKEN, "A2A-Version": "1.0" };
  if (body) headers["Content-Type"] = "application/json";
  const res = await fetch(base + p.replace(/^\//, ""), { method, headers, body: body && JSON.stringify(body) });
  const j = await res.json();
  assert.ok(res.ok, method + " " + p + ": " + JSON.stringify(j));
  return j;
}

let sent = 0;
// A new Task from `text`; resolves once the model has parked it.
async function parkedTask(text) {
  const r = await api("POST", "/message:send", { configuration: { returnImmediately: true },
    message: { messageId: "console-test-" + (++sent), role: "ROLE_USER", parts: [{ text }] } });
  const id = r.task.id;
  for (let i = 0; i < 200; i++) {
    const t = await api("GET", "/tasks/" + encodeURIComponent(id) + "?historyLength=0");
    if (t.status.state === "TASK_STATE_INPUT_REQUIRED") return id;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error("Task " + id + " did not park");
}

const text = (sel) => page.$eval(sel, (e) => e.textContent);

async function openInPage(id) {
  await page.evaluate((h) => { location.hash = h; }, "#/task/" + encodeURIComponent(id));
  await page.waitForFunction((tid) => document.querySelector("#task h2")?.textContent === tid, WAIT, id);
}

async function shot(name) {
  if (!process.env.TNX_SHOTS) return;
  fs.mkdirSync(process.env.TNX_SHOTS, { recursive: true });
  await page.screenshot({ path: path.join(process.env.TNX_SHOTS, name) });
}

before(async () => {
  model = await startFakeModel();
  fs.writeFileSync(path.join(tmp, "tokens.json"), JSON.stringify({ [TOKEN]: "alice" }));
  fs.writeFileSync(path.join(tmp, "serve.json"), JSON.stringify({
    agent: "llm", a2a: { store: "file:" + path.join(tmp, "tasks") },
    llm: { base_url: model.url, model: "demo", api_key_env: "DEMO_API_KEY", retry_initial_ms: 50,
      tools: [{ name: "authorize", description: "Ask a person to authorize an action",
        parameters: { type: "object", properties: { action: { type: "string" } } }, approval: true,
        result: "authorized" }] } }));
  server = await startServer(0);
  base = server.url;
  browser = await puppeteer.launch({ executablePath: process.env.TNX_CHROMIUM || "/usr/bin/chromium",
    headless: true, args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
  page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 800 });
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.on("console", (m) => {
    if (/Content Security Policy|Refused to/i.test(m.text())) problems.push("console: " + m.text());
  });
  page.on("request", (r) => { if (r.url().endsWith(":subscribe")) subscribes.push(r.headers()); });
});

after(async () => {
  if (browser) await browser.close();
  if (server) await stopServer(server).catch(() => {});
  if (model) await model.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

test("signs in with a pasted token, kept in memory only", async () => {
  const res = await page.goto(base + "console/");
  assert.equal(res.status(), 200);
  assert.match(res.headers()["content-security-policy"], /script-src 'self'/);
  await page.type("#token", TOKEN);
  await page.click("#signin-button");
  await page.waitForFunction(() => !document.getElementById("main").hidden, WAIT);
  assert.equal(await page.$eval("#token", (e) => e.value), "", "the token field is cleared");
  const stored = await page.evaluate(() => [localStorage.length, sessionStorage.length, document.cookie]);
  assert.deepEqual(stored, [0, 0, ""]);
});

test("a Task parked on authorize shows in the list without a reload; approve shows the model's answer", async () => {
  const id = await parkedTask("deploy v2");
  // The list refreshes itself: no reload, no click.
  await page.waitForFunction((tid) => document.querySelector(`#tasks li[data-task-id="${tid}"].waiting-row`),
    WAIT, id);
  assert.match(await text("#waiting-input"), /^\d+ input-required$/);
  assert.match(await text("#total"), /^\d+ Tasks?$/);
  await page.click(`#tasks li[data-task-id="${id}"] a`);
  await page.waitForFunction(() => document.querySelector("#live")?.textContent === "live", WAIT);
  assert.equal(await text(".question .tool"), "authorize");
  assert.deepEqual(JSON.parse(await text(".question .args")), { action: "deploy v2" });
  await shot("task.png");
  // isMobile would reload the page, and with it the token (kept in memory only).
  await page.setViewport({ width: 390, height: 844 });
  await shot("phone.png");
  const phoneFits = await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth);
  await page.setViewport({ width: 1280, height: 800 });
  assert.ok(phoneFits, "the page fits a 390px wide screen (no horizontal scroll)");
  await page.click("#approve");
  await page.waitForFunction(() => document.getElementById("artifacts").textContent
    .includes("Deployed (the tool said: authorized)."), WAIT);
  await page.waitForFunction(() => document.querySelector("#task .state")?.textContent === "completed", WAIT);
  assert.equal(await page.$eval("#approve", (e) => e.disabled), true);
});

test("a Task's text is rendered as text: an <img onerror> makes no element and runs nothing", async () => {
  const hostile = '<img src=x onerror="window.__pwned=1">';
  const id = await parkedTask(hostile);
  await page.waitForFunction((tid) => document.querySelector(`#tasks li[data-task-id="${tid}"]`), WAIT, id);
  await openInPage(id);
  await page.waitForFunction(() => !document.querySelector(".question").hidden, WAIT);
  assert.deepEqual(JSON.parse(await text(".question .args")), { action: hostile });
  assert.ok((await text("#history")).includes(hostile), "the history shows the text as typed");
  // The list's summary is the prompt, where the text is inside JSON (its quotes escaped).
  assert.ok((await text("#tasks")).includes('<img src=x onerror=\\"window.__pwned=1\\">'),
    "the list shows it as text too");
  await new Promise((resolve) => setTimeout(resolve, 300));
  assert.equal(await page.evaluate(() => document.querySelectorAll("img").length), 0);
  assert.equal(await page.evaluate(() => typeof window.__pwned), "undefined");
});

test("deny with a comment: the model is sent the comment", async () => {
  const id = await parkedTask("drop the production database");
  await openInPage(id);
  await page.waitForFunction(() => !document.getElementById("deny").disabled, WAIT);
  await page.type("#comment", "not today");
  await page.click("#deny");
  await page.waitForFunction(() => document.getElementById("artifacts").textContent.includes("denied"), WAIT);
  const toolResults = model.requests.flatMap((r) => r.messages).filter((m) => m.role === "tool").map((m) => m.content);
  assert.ok(toolResults.some((c) => c.startsWith("denied") && c.includes("User comment: not today")),
    JSON.stringify(toolResults));
});

test("cancel a parked Task: the page shows it canceled at once", async () => {
  const id = await parkedTask("rotate keys");
  await openInPage(id);
  await page.waitForFunction(() => !document.getElementById("cancel").disabled, WAIT);
  await page.click("#cancel");
  await page.waitForFunction(() => document.querySelector("#task .state")?.textContent === "canceled", WAIT);
  assert.equal(await page.$eval("#cancel", (e) => e.disabled), true);
});

test("the stream reconnects with Last-Event-ID after the server restarts, and the page stays live", async () => {
  const id = await parkedTask("restart me");
  await openInPage(id);
  await page.waitForFunction(() => document.querySelector("#live")?.textContent === "live", WAIT);
  const before = subscribes.length;
  const port = new URL(base).port;
  await stopServer(server);
  server = await startServer(port);
  const resumed = () => subscribes.slice(before).filter((h) => h["last-event-id"]);
  for (let i = 0; i < 400 && resumed().length === 0; i++) await new Promise((resolve) => setTimeout(resolve, 50));
  assert.ok(resumed().length > 0, "a resubscription sent Last-Event-ID: " + JSON.stringify(subscribes.slice(before)));
  await page.waitForFunction(() => document.querySelector("#live")?.textContent === "live", WAIT);
  // Approved by another client: the page learns it from its stream alone.
  await api("POST", "/message:send", { configuration: { returnImmediately: true },
    message: { messageId: "console-test-approve", role: "ROLE_USER", taskId: id, parts: [{ text: "approve" }] } });
  await page.waitForFunction(() => document.getElementById("artifacts").textContent
    .includes("Deployed (the tool said: authorized)."), WAIT);
});

test("the list: every Task of the run, newest first, the parked ones called out", async () => {
  await parkedTask("restart the billing service");
  await page.evaluate(() => { location.hash = "#/"; });
  await page.waitForFunction(() => document.querySelectorAll("#tasks li[data-task-id]").length === 6, WAIT);
  await page.waitForFunction(() => document.querySelectorAll("#tasks li.waiting-row").length === 2, WAIT);
  assert.equal(await text("#total"), "6 Tasks");
  assert.equal(await text("#waiting-input"), "2 input-required");
  const states = await page.$$eval("#tasks .state", (es) => es.map((e) => e.textContent));
  assert.deepEqual(states.sort(), ["canceled", "completed", "completed", "completed", "input-required",
    "input-required"]);
  await shot("list.png");
});

test("no page error and no Content-Security-Policy violation", () => {
  assert.deepEqual(problems, []);
});
