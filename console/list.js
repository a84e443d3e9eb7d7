// The Task list: the store's own ListTasks pages (newest first, filtered by
// state and contextId), the count of the filter and of the Tasks waiting for
// a person, refreshed every few seconds without a reload.
import { ApiError, listTasks } from "./api.js";
import { el, fill, isWaiting, partsText, stateBadge, when } from "./dom.js";

const REFRESH_MS = 2000;

const $ = (id) => document.getElementById(id);

const view = {
  filter: { status: "", contextId: "", pageSize: 50 },
  // pageToken of each page shown so far: tokens[0] = "" (the first page).
  tokens: [""],
  next: "",
  openId: "",
  timer: 0,
  generation: 0,
  wired: false,
  running: false,
  onError: () => {},
};

function row(t) {
  const state = t.status ? t.status.state : "";
  const msg = t.status && t.status.message ? partsText(t.status.message.parts) : "";
  const li = el("li", { class: isWaiting(state) ? "waiting-row" : null, "data-task-id": t.id },
    el("a", { href: "#/task/" + encodeURIComponent(t.id) },
      stateBadge(state),
      el("span", { class: "id" }, String(t.id)),
      el("span", { class: "when" }, when(t.status && t.status.timestamp)),
      el("span", { class: "summary" }, msg.slice(0, 300))));
  if (t.id === view.openId) li.classList.add("open");
  return li;
}

function plural(n, one, many) { return n + " " + (n === 1 ? one : many); }

async function load() {
  const gen = ++view.generation;
  const f = view.filter;
  const page = view.tokens.length - 1;
  const q = { status: f.status, contextId: f.contextId, pageSize: f.pageSize, pageToken: view.tokens[page] };
  const waitingQ = (status) => listTasks({ status, contextId: f.contextId, pageSize: 1 });
  const [res, input, auth] = await Promise.all([listTasks(q), waitingQ("TASK_STATE_INPUT_REQUIRED"),
    waitingQ("TASK_STATE_AUTH_REQUIRED")]);
  if (gen !== view.generation) return;  // a newer load has started
  const tasks = Array.isArray(res.tasks) ? res.tasks : [];
  fill($("tasks"), ...(tasks.length ? tasks.map(row) : [el("li", { class: "empty" }, "No Tasks.")]));
  const total = Number(res.totalSize || 0);
  $("total").textContent = plural(total, "Task", "Tasks") + (f.status || f.contextId ? " match" : "");
  const ni = Number(input.totalSize || 0);
  const na = Number(auth.totalSize || 0);
  $("waiting-input").textContent = ni ? ni + " input-required" : "";
  $("waiting-auth").textContent = na ? na + " auth-required" : "";
  view.next = typeof res.nextPageToken === "string" ? res.nextPageToken : "";
  $("prev").disabled = page === 0;
  $("next").disabled = view.next === "";
  const size = Number(f.pageSize);
  $("page-no").textContent = tasks.length ? (page * size + 1) + "–" + (page * size + tasks.length) : "";
}

/** Reloads the page shown now (errors go to the handler given to start). */
export function refresh() {
  return load().then(() => listStatus(""), (e) => {
    if (e instanceof ApiError && e.status === 401) view.onError(e);
    else listStatus("The list could not be refreshed (retrying): " + e.message);
  });
}

// A refresh that failed (a server restart, a network blip) is said in the
// list itself, and unsaid by the next one that works.
function listStatus(text) {
  $("list-status").textContent = text;
  $("list-status").hidden = text === "";
}

function schedule() {
  clearTimeout(view.timer);
  if (!view.running) return;
  view.timer = setTimeout(async () => {
    if (document.visibilityState === "visible") await refresh();
    schedule();
  }, REFRESH_MS);
}

/** Wires the filter form and pager, shows the first page, keeps it fresh. */
export function startList(onError) {
  view.onError = onError;
  if (!view.wired) wire();
  view.running = true;
  refresh();
  schedule();
}

function wire() {
  view.wired = true;
  $("filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    view.filter = { status: $("state").value, contextId: $("context").value.trim(), pageSize: Number($("page-size").value) };
    view.tokens = [""];
    refresh();
  });
  for (const id of ["waiting-input", "waiting-auth"]) {
    $(id).addEventListener("click", () => {
      $("state").value = $(id).dataset.state;
      $("filters").requestSubmit();
    });
  }
  $("prev").addEventListener("click", () => {
    if (view.tokens.length > 1) view.tokens.pop();
    refresh();
  });
  $("next").addEventListener("click", () => {
    if (view.next === "") return;
    view.tokens.push(view.next);
    refresh();
  });
}

/** Stops refreshing (sign-out). */
export function stopList() {
  view.running = false;
  clearTimeout(view.timer);
  view.generation++;
  fill($("tasks"));
}

/** Marks the open Task's row. */
export function markOpen(id) {
  view.openId = id;
  for (const li of document.querySelectorAll("#tasks li")) li.classList.toggle("open", li.dataset.taskId === id);
}
