#!/usr/bin/env python3
"""The docs test: the commands in the docs run, and what the docs say they
print is what they print. Called by docs_test.sh (which installs the build
into a fresh PREFIX first); see there for how to run it by hand.

The pages: docs/*.md, README.md and examples/*/README.md.

The convention, for whoever writes a page:

  ```sh        runs. The sh blocks of one page run in order in one bash
               (variables and background jobs carry over), in a fresh
               directory (for examples/X/README.md, a fresh copy of
               examples/X), with set -euo pipefail, the build's bin/ first on
               PATH, PREFIX a fresh install of the build (of a sanitizer
               build, CXXFLAGS then carries its -fsanitize, as a C++ program
               linking its libraries needs), and each
               127.0.0.1:8NNN (8080, 8090, ...) replaced by a free port of
               its own (in the expected output too). A block that exits
               non-zero fails the page.
  ```output    right after a ```sh block (only blank lines between): what
               that block prints, stdout and stderr together, compared line
               by line (trailing blanks and trailing empty lines ignored).
               Variable parts are written `...`: inside a line it matches any
               text on that line (an id, a timestamp, a duration); a line that
               is only `...` matches any number of lines, none included.
               A job a block starts in the background writes into that
               block's output: send a server's output to a file
               (`toolnexus serve ... > serve.log 2>&1 &`).
  ```shell     is shown and not run: commands that build for minutes, serve
               until stopped, or need paths of the reader's machine. Quote no
               output of them (or show it after a ```sh block that runs).
  <!-- docs-test: why ... ```sh ... ``` -->
               a ```sh block inside an HTML comment runs like the others, but
               a reader does not see it: a step the reader does by hand (the
               README starts the server `./dev serve` starts, before its curl
               example). Say why in the comment.
  ```json, ```c, ```cpp, ```cmake, ```text, ...  are shown, not run.

Numbers in prose that no block prints are held by the rules at the end of
this file:
  - the plugin ABI version a page states is the header's
    (TNX_ABI_MAJOR.TNX_ABI_MINOR); an older one is written as history
    ("since ABI 1.2", "built against ABI 1.0");
  - the defaults in docs/configuration.md's table are those of
    `toolnexus serve --help`;
  - `./dev serve` runs `toolnexus serve` with no flags of its own (the
    README's hidden server is started that way).
A failure names the page and line, and shows what was expected and what
came; a failed page's directory is kept (its path is printed).

usage: docs_test.py BUILD_DIR SOURCE_DIR PREFIX
"""
import concurrent.futures
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

FENCE = re.compile(r"^(\s*)```\s*(\S*)")
PAGE_TIMEOUT_S = 150
LOCAL = re.compile(r"127\.0\.0\.1:8\d\d\d\b")


class Block:
    """One fenced block: its info word, first content line (1-based), lines
    (without the fence's indentation), and (sh only) the ```output block
    that follows it."""

    def __init__(self, lang, line):
        self.lang, self.line = lang, line
        self.lines = []
        self.output = None


def parse(path):
    """The fenced blocks of a page, in order; raises ValueError on a fence
    left open or an output block that follows no sh block."""
    blocks, cur, indent = [], None, ""
    blank_since_sh = False  # only blank lines since the last sh block closed
    with open(path, encoding="utf-8") as f:
        text = f.read().split("\n")
    for n, raw in enumerate(text, 1):
        if cur is not None:
            if raw.strip() == "```":
                if cur.lang == "output":
                    prev = blocks[-1] if blocks else None
                    if prev is None or prev.lang != "sh" or not blank_since_sh or prev.output is not None:
                        raise ValueError(f"{path}:{cur.line - 1}: an ```output block must follow a ```sh block "
                                         "(only blank lines between)")
                    prev.output = cur
                    blank_since_sh = False
                else:
                    blocks.append(cur)
                    blank_since_sh = cur.lang == "sh"
                cur = None
                continue
            cur.lines.append(raw[len(indent):] if raw.startswith(indent) else raw.lstrip())
            continue
        m = FENCE.match(raw)
        if m:
            indent = m.group(1)
            cur = Block(m.group(2), n + 1)
            continue
        if raw.strip():
            blank_since_sh = False
    if cur is not None:
        raise ValueError(f"{path}:{cur.line - 1}: a ``` block is never closed")
    return blocks


_given_ports = set()
_given_lock = threading.Lock()


def free_port():
    """A TCP port on 127.0.0.1 that is free now and was not given before in
    this run. Chosen at random below the kernel's ephemeral range (Linux:
    32768 and up), where no other test's port-0 listener or outgoing
    connection can take it between now and the page's server binding it;
    never the same port twice, since pages run at once and a page names
    several (CI once gave a page's :8080 and :8081 the same port, and its
    second server never started)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(10000, max(low, 10001))
        with _given_lock:
            if port in _given_ports:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _given_ports.add(port)
            return port
    raise RuntimeError("no free TCP port on 127.0.0.1 between 10000 and the ephemeral range")


def pattern(line):
    """A regex for one expected line: `...` matches any text."""
    return re.compile(".*?".join(re.escape(p) for p in line.split("...")) + r"\Z", re.S)


def compare(expected, actual):
    """None if the actual lines match the expected ones, else (index of the
    first expected line that could not be matched, or len(expected) when
    actual has lines left over; the actual line found there or None)."""
    pats = [None if e.strip() == "..." else pattern(e) for e in expected]
    best = [(-1, 0)]  # the furthest (expected index, actual index) reached

    memo = {}

    def match(i, j):
        if (i, j) in memo:
            return memo[(i, j)]
        if (i, j if j < len(actual) else -1) > best[0]:  # prefer a real line to the end
            best[0] = (i, j if j < len(actual) else -1)
        if i == len(pats):
            ok = j == len(actual)
        elif pats[i] is None:
            ok = any(match(i + 1, k) for k in range(j, len(actual) + 1))
        else:
            ok = j < len(actual) and pats[i].match(actual[j]) is not None and match(i + 1, j + 1)
        memo[(i, j)] = ok
        return ok

    if match(0, 0):
        return None
    i, j = best[0]
    return i, actual[j] if j >= 0 else None


def lines_of(text):
    """The lines of a text, without trailing blanks and trailing empty lines."""
    out = [l.rstrip() for l in text.split("\n")]
    while out and not out[-1]:
        out.pop()
    return out


def run_page(path, rel, seed):
    """Runs the sh blocks of one page in a fresh directory holding a copy of
    seed (when not None); returns (ok, report lines)."""
    try:
        blocks = [b for b in parse(path) if b.lang == "sh"]
    except ValueError as e:
        return False, [f"== {rel}", f"   FAILED: {e}"]
    if not blocks:
        return True, []
    ports = {}  # 127.0.0.1:8NNN of the page -> 127.0.0.1:<a free port>

    def local(line):
        def port(m):
            if m.group(0) not in ports:
                ports[m.group(0)] = f"127.0.0.1:{free_port()}"
            return ports[m.group(0)]
        return LOCAL.sub(port, line)

    work = tempfile.mkdtemp(prefix="tnx-docs-")
    if seed is not None:
        shutil.copytree(seed, work, dirs_exist_ok=True)
    outs = os.path.join(work, ".docs-test")
    os.mkdir(outs)
    script = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    for i, b in enumerate(blocks):
        script.append(f'exec >"{outs}/{i}" 2>&1')
        script.extend(local(l) for l in b.lines)
    report = [f"== {rel} ({', '.join(f'{k} is {v}' for k, v in ports.items()) or 'no ports'}; in {work})"]
    start = time.monotonic()
    # Its own session, so that whatever a page left running (a server it
    # did not stop, a timed-out block's children) is ended with it.
    with open(os.path.join(outs, "bash"), "w") as log:
        proc = subprocess.Popen(["bash", "-c", "\n".join(script)], cwd=work, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=PAGE_TIMEOUT_S)
            why = f"exited {rc}"
        except subprocess.TimeoutExpired:
            rc, why = -1, f"did not finish in {PAGE_TIMEOUT_S} s"
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    secs = time.monotonic() - start
    ran = [i for i in range(len(blocks)) if os.path.exists(f"{outs}/{i}")]

    def output(i):
        with open(f"{outs}/{i}", encoding="utf-8", errors="replace") as f:
            return f.read()

    problems = []
    if rc != 0:
        last = ran[-1] if ran else 0
        problems.append(f"{rel}:{blocks[last].line}: the block starting here {why}; its output:")
        problems.extend("   | " + l for l in lines_of(output(last)) if ran)
        # What the page's servers said: a server that could not start (its
        # port taken, a bad config) is the usual cause of a block that hangs
        # or of curl's "000", and the work directory is gone in CI.
        for name in sorted(os.listdir(work)):
            if not name.endswith((".err", ".log")) or not os.path.isfile(os.path.join(work, name)):
                continue
            with open(os.path.join(work, name), encoding="utf-8", errors="replace") as f:
                tail = lines_of(f.read())[-6:]
            if tail:
                problems.append(f"{name} ends with:")
                problems.extend("   | " + l for l in tail)
    for i in ran if rc == 0 else ran[:-1]:
        b = blocks[i]
        if b.output is None:
            continue
        expected = [local(l) for l in lines_of("\n".join(b.output.lines))]
        actual = lines_of(output(i))
        bad = compare(expected, actual)
        if bad is None:
            continue
        k, got = bad
        where = b.output.line + min(k, len(expected) - 1) if expected else b.output.line
        want = expected[k] if k < len(expected) else "(end of output)"
        problems.append(f"{rel}:{where}: the output of the block at line {b.line} differs")
        problems.append(f"   expected: {want}")
        problems.append(f"   actual:   {got if got is not None else '(end of output)'}")
        problems.append("   the whole output:")
        problems.extend("   | " + l for l in actual)
    if problems:
        report.append(f"   FAILED ({secs:.1f} s)")
        report.extend("   " + p for p in problems)
    else:
        report.append(f"   ok: {len(blocks)} blocks, {sum(b.output is not None for b in blocks)} outputs "
                      f"checked ({secs:.1f} s)")
        shutil.rmtree(work, ignore_errors=True)
    return not problems, report


# ---- rules for numbers in prose ---------------------------------------------

ABI_MENTION = re.compile(r"(\w+)?\W{0,2}\bABI (?:\(version )?(\d+)\.(\d+)")
HISTORY_WORDS = {"since", "against", "than", "before", "from", "or"}


def check_abi(pages, src):
    """Every 'ABI M.N' of the pages is the header's version, unless written as
    history ('since ABI 1.2'); a historical one is never newer than it."""
    with open(os.path.join(src, "sdk/include/toolnexus/task_store.h"), encoding="utf-8") as f:
        header = f.read()
    major = int(re.search(r"#define TNX_ABI_MAJOR (\d+)", header).group(1))
    minor = int(re.search(r"#define TNX_ABI_MINOR (\d+)", header).group(1))
    problems = []
    for path, rel in pages:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                for m in ABI_MENTION.finditer(line):
                    said = (int(m.group(2)), int(m.group(3)))
                    history = (m.group(1) or "").lower() in HISTORY_WORDS
                    if said == (major, minor) or (history and said[0] == major and said[1] < minor):
                        continue
                    problems.append(f"{rel}:{n}: says ABI {said[0]}.{said[1]}, but "
                                    f"sdk/include/toolnexus/task_store.h is ABI {major}.{minor}"
                                    + ("" if history else " (an older version that is meant is written "
                                       "'since ABI M.N')"))
    return problems


NUMBER = re.compile(r"(\d[\d,]*)(?:\s*(KiB|MiB|GiB))?")
UNITS = {None: 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def numbers(text):
    """The integers of a text, "8 MiB" as 8388608 and "1,000" as 1000."""
    return [int(m.group(1).replace(",", "")) * UNITS[m.group(2)] for m in NUMBER.finditer(text)]


def check_serve_defaults(src):
    """The defaults of docs/configuration.md's table are the ones
    `toolnexus serve --help` prints. For each flag of a row whose help says
    "(default N": the row's default column says N (a row of several flags:
    its numbers in the order of the flags; "1 MiB" is 1048576); a default
    that is not a number (an address) is written in the column as it is."""
    rel = "docs/configuration.md"
    help_text = subprocess.run(["toolnexus", "serve", "--help"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True).stdout
    helps, flag = {}, None
    for line in help_text.split("\n"):
        m = re.match(r"  (--[a-z-]+)", line)
        if m:
            flag = m.group(1)
            helps[flag] = line
        elif flag and line.startswith("    "):
            helps[flag] += " " + line.strip()
        else:
            flag = None
    problems, rows = [], 0
    with open(os.path.join(src, rel), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `") else []
            if len(cells) < 4:
                continue
            flags = re.findall(r"--[a-z-]+", cells[1])
            said = numbers(re.sub(r"`[^`]*`", "", cells[2]))
            for i, fl in enumerate(flags):
                if fl not in helps:
                    problems.append(f"{rel}:{n}: {fl} is not an option of `toolnexus serve --help`")
                    continue
                m = re.search(r"\(default ([^;,)\s]+)", helps[fl])
                if not m:
                    continue
                rows += 1
                if not m.group(1).isdigit():  # an address, a name: written as it is
                    if m.group(1) not in cells[2]:
                        problems.append(f"{rel}:{n}: the default of {fl} is {m.group(1)} in `toolnexus serve "
                                        f"--help`, not in the table")
                    continue
                want = int(m.group(1))
                got = said[i] if len(flags) > 1 and i < len(said) else (said[0] if said else None)
                if got != want:
                    problems.append(f"{rel}:{n}: says {fl} defaults to {got}, but `toolnexus serve --help` says "
                                    f"{want}")
    if rows == 0:
        problems.append(f"{rel}: no default of its table was compared with `toolnexus serve --help`")
    return problems


def check_dev_serve(src):
    """The README's hidden server is `toolnexus serve` with the default flags:
    `./dev serve` must pass none of its own."""
    with open(os.path.join(src, "dev"), encoding="utf-8") as f:
        dev = f.read()
    if not re.search(r'/toolnexus" serve "\$@"', dev):
        return ["dev: `./dev serve` no longer runs `toolnexus serve \"$@\"` alone; the README's Quick start "
                "example starts the server with the default flags: update its hidden docs-test block"]
    return []


def sanitizer_flags(prefix):
    """-fsanitize=... of a sanitizer build (whose installed libraries need
    the sanitizer runtime first in a program linking them), else None."""
    ldd = subprocess.run(["ldd", os.path.join(prefix, "lib", "libtoolnexus_server.so")],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    san = [name for lib, name in (("libasan", "address"), ("libubsan", "undefined")) if lib in ldd]
    return "-fsanitize=" + ",".join(san) if san else None


def main():
    build, src = sys.argv[1], sys.argv[2]
    os.environ["PATH"] = os.path.join(build, "bin") + os.pathsep + os.environ["PATH"]
    os.environ.pop("TOOLNEXUS_PLUGIN_PATH", None)
    os.environ["PREFIX"] = sys.argv[3]
    san = sanitizer_flags(sys.argv[3])
    if san:
        # C++ only: CMake links a C++ program with CXXFLAGS too, while a C
        # plugin (kv) needs no runtime of its own and shows ldd's plain list.
        print(f"== the build is a sanitizer build: C++ in the pages builds with {san}")
        os.environ["CXXFLAGS"] = (os.environ.get("CXXFLAGS", "") + " " + san).strip()
    rels = sorted(f"docs/{f}" for f in os.listdir(os.path.join(src, "docs")) if f.endswith(".md"))
    rels.append("README.md")
    rels += sorted(f"examples/{d}/README.md" for d in os.listdir(os.path.join(src, "examples"))
                   if os.path.exists(os.path.join(src, "examples", d, "README.md")))
    pages = [(os.path.join(src, r), r) for r in rels]

    def seed(rel):
        return os.path.join(src, os.path.dirname(rel)) if rel.startswith("examples/") else None

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda p: run_page(p[0], p[1], seed(p[1])), pages))
    failed = 0
    for ok, report in results:
        if report:
            print("\n".join(report))
        failed += not ok
    rules = check_abi(pages, src) + check_dev_serve(src) + check_serve_defaults(src)
    print("== rules for numbers in prose")
    print("\n".join("   " + p for p in rules) if rules else "   ok")
    ran = sum(1 for _, r in results if r)
    print(f"{ran - failed} pages passed, {failed} failed, rules: {len(rules)} problems "
          f"({time.monotonic() - start:.1f} s)")
    return 0 if failed == 0 and not rules and ran > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
