// The approval console with real identities (issue 24): `toolnexus serve
// --console` with `auth.jwt` (HS256 keys from a JWKS file), driven in
// Debian's chromium (headless, via puppeteer-core). Tokens are made here, as
// an issuer would make them:
//   - signed in with alice's JWT, the list holds exactly alice's Tasks and
//     the count says so; bob's Task opened by its id shows nothing of it;
//   - an expired JWT is refused at sign-in (401), and the page stays signed out;
//   - signed in with bob's JWT (sign out, sign in), only bob's Task.
// Env: TNX_BIN (the toolnexus program), TNX_CHROMIUM.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import puppeteer from "puppeteer-core";
import { startServe, stopServe } from "./serve.mjs";

const WAIT = { timeout: 20000, polling: 100 };
const ISSUER = "https://login.example.test";
const SECRET = crypto.randomBytes(32);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "toolnexus-console-jwt-"));
let server, base, browser, page;
const problems = [];
const tasks = { alice: [], bob: [] };

// A compact JWS (HS256) for `sub`, expiring `seconds` from now.
function jwt(sub, seconds) {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString("base64url");
  const head = b64({ alg: "HS256", typ: "JWT", kid: "console-test" });
  const body = b64({ iss: ISSUER, aud: "toolnexus", sub, exp: Math.floor(Date.now() / 1000) + seconds });
  const sig = crypto.createHmac("sha256", SECRET).update(head + "." + body).digest("base64url");
  return head + "." + body + "." + sig;
}

function startServer() {
  return startServe(["--config", path.join(tmp, "serve.json"), "--listen", "127.0.0.1:0", "--console",
    "--drain-timeout-ms", "200"]);
}

// A Task of `who` (its text names the owner); resolves with its id.
async function taskOf(who, text) {
  const res = await fetch(base + "message:send", {
    method: "POST",
    headers: { Authorization: "Bearer " + jwt(who, 600), "A2A-Version": "1.0", "Content-Type": "application/json" },
    body: JSON.stringify({ message: { messageId: crypto.randomUUID(), role: "ROLE_USER", parts: [{ text }] } }),
  });
  const j = await res.json();
  assert.ok(res.ok, JSON.stringify(j));
  tasks[who].push(j.task.id);
  return j.task.id;
}

async function signIn(token) {
  await page.type("#token", token);
  await page.click("#signin-button");
}

const listed = () => page.$$eval("#tasks li[data-task-id]", (es) => es.map((e) => e.dataset.taskId).sort());

before(async () => {
  fs.writeFileSync(path.join(tmp, "jwks.json"), JSON.stringify({
    keys: [{ kty: "oct", kid: "console-test", k: SECRET.toString("base64url") }] }));
  fs.writeFileSync(path.join(tmp, "serve.json"), JSON.stringify({
    auth: { jwt: { issuer: ISSUER, audience: "toolnexus", jwks_file: "jwks.json", algorithms: ["HS256"] } } }));
  server = await startServer();
  base = server.url;
  await taskOf("alice", "alice's first secret");
  await taskOf("alice", "alice's second secret");
  await taskOf("bob", "bob's own secret");
  browser = await puppeteer.launch({ executablePath: process.env.TNX_CHROMIUM || "/usr/bin/chromium",
    headless: true, args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
  page = await browser.newPage();
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.on("console", (m) => {
    if (/Content Security Policy|Refused to/i.test(m.text())) problems.push("console: " + m.text());
  });
  await page.goto(base + "console/");
});

after(async () => {
  if (browser) await browser.close();
  if (server) await stopServe(server);
  fs.rmSync(tmp, { recursive: true, force: true });
});

test("signed in with alice's JWT: exactly alice's Tasks; bob's Task by its id shows nothing of it", async () => {
  await signIn(jwt("alice", 600));
  await page.waitForFunction(() => !document.getElementById("main").hidden, WAIT);
  await page.waitForFunction(() => document.querySelectorAll("#tasks li[data-task-id]").length === 2, WAIT);
  assert.deepEqual(await listed(), [...tasks.alice].sort());
  assert.equal(await page.$eval("#total", (e) => e.textContent), "2 Tasks");
  await page.evaluate((h) => { location.hash = h; }, "#/task/" + encodeURIComponent(tasks.bob[0]));
  await page.waitForFunction(() => /stopped|not found|no task/i.test(document.getElementById("task").textContent)
    || !document.getElementById("notice").hidden, WAIT);
  const shown = await page.evaluate(() => document.body.textContent);
  assert.ok(!shown.includes("bob's own secret"), "bob's text is not shown to alice");
  await page.evaluate(() => { location.hash = "#/"; });
});

test("an expired JWT is refused at sign-in with a 401, and the page stays signed out", async () => {
  await page.click("#signout");
  await page.waitForFunction(() => document.getElementById("main").hidden, WAIT);
  await signIn(jwt("alice", -3600));
  await page.waitForFunction(() => document.getElementById("notice").textContent.includes("401"), WAIT);
  assert.equal(await page.$eval("#main", (e) => e.hidden), true);
});

test("signed in with bob's JWT: only bob's Task", async () => {
  await signIn(jwt("bob", 600));
  await page.waitForFunction(() => !document.getElementById("main").hidden, WAIT);
  await page.waitForFunction(() => document.querySelectorAll("#tasks li[data-task-id]").length >= 1, WAIT);
  await new Promise((resolve) => setTimeout(resolve, 300));  // a second page would show by now
  assert.deepEqual(await listed(), tasks.bob);
  assert.equal(await page.$eval("#total", (e) => e.textContent), "1 Task");
  assert.ok(!(await page.evaluate(() => document.body.textContent)).includes("alice's"), "no text of alice's");
});

test("no page error and no Content-Security-Policy violation", () => {
  assert.deepEqual(problems, []);
});
