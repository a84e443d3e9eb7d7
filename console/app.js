// The console's entry: sign-in with a pasted bearer token (kept in memory
// only), then the Task list and the open Task, by the URL's fragment:
// "#/" the list, "#/task/<id>" one Task.
import { ApiError, listTasks, setToken } from "./api.js";
import { markOpen, refresh, startList, stopList } from "./list.js";
import { closeTask, openTask } from "./task.js";

const $ = (id) => document.getElementById(id);

function notice(text) {
  $("notice").textContent = text;
  $("notice").hidden = text === "";
}

function onError(e) {
  if (e instanceof ApiError && e.status === 401) {
    signOut();
    notice(e.message);
    return;
  }
  notice(e instanceof Error ? e.message : String(e));
}

function route() {
  if ($("main").hidden) return;
  const m = /^#\/task\/(.+)$/.exec(location.hash);
  if (m) {
    let id = "";
    try { id = decodeURIComponent(m[1]); } catch { id = m[1]; }
    $("task-pane").hidden = false;
    $("main").classList.add("task-open");
    markOpen(id);
    openTask(id, $("task"), onError);
  } else {
    closeTask();
    $("task-pane").hidden = true;
    $("main").classList.remove("task-open");
    markOpen("");
    refresh();
  }
}

async function signIn(ev) {
  ev.preventDefault();
  const t = $("token").value.trim();
  setToken(t);
  $("token").value = "";
  try {
    await listTasks({ pageSize: 1 });
  } catch (e) {
    setToken("");
    notice(e instanceof ApiError && e.status === 401 ? "that token was refused (401)" : "cannot reach the API: " + e.message);
    return;
  }
  notice("");
  $("signin").hidden = true;
  $("who").hidden = false;
  $("who-text").textContent = t === "" ? "no token (the server does not ask for one)" : "signed in";
  $("main").hidden = false;
  startList(onError);
  route();
}

function signOut() {
  setToken("");
  closeTask();
  stopList();
  $("main").hidden = true;
  $("who").hidden = true;
  $("signin").hidden = false;
  $("token").focus();
}

$("signin").addEventListener("submit", signIn);
$("signout").addEventListener("click", () => { signOut(); notice(""); });
window.addEventListener("hashchange", route);
$("token").focus();
