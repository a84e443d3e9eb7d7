#!/usr/bin/env python3
"""The whole /metrics page through a real Prometheus text parser (Debian's
python3-prometheus-client, prometheus_client.parser): a `toolnexus serve`
started from a config file with "admin": {"listen": ...} answers A2A calls of
every transport, then its page must parse, name every family with HELP and
TYPE, follow the naming conventions (counters end in _total, durations in
_seconds) and hold histograms whose buckets add up.

usage: metrics_exposition_test.py TOOLNEXUS_BINARY"""
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def call(url, path, body=None, headers=None):
    req = urllib.request.Request(url.rstrip("/") + path, data=body, headers=headers or {},
                                 method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def rpc(url, method, params, version=None):
    headers = {"Content-Type": "application/json"}
    if version:
        headers["A2A-Version"] = version
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    return call(url, "/", body, headers)


def main():
    exe = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "serve.json")
        with open(config, "w") as f:
            json.dump({"listen": "127.0.0.1:0", "admin": {"listen": "127.0.0.1:0"}, "log_level": "error"}, f)
        server = subprocess.Popen([exe, "serve", "--config", config], stdout=subprocess.PIPE, text=True)
        try:
            url = re.fullmatch(r"listening on (\S+)\n", server.stdout.readline()).group(1)
            admin = re.fullmatch(r"admin listening on (\S+)\n", server.stdout.readline()).group(1)
            # JSON-RPC in both dialects, HTTP+JSON, a stream, an error.
            _, _, sent = rpc(url, "message/send", {"message": {"role": "user", "messageId": "m1", "kind": "message",
                                                               "parts": [{"kind": "text", "text": "hi"}]}})
            task = json.loads(sent)["result"]["id"]
            rpc(url, "GetTask", {"id": task}, "1.0")
            rpc(url, "tasks/get", {"id": task})
            check(call(url, "/tasks/" + task)[0] == 200, "REST GetTask")
            check(call(url, "/tasks/nope")[0] == 404, "REST GetTask of an unknown Task")
            status, _, _ = call(url, "/message:stream",
                                json.dumps({"message": {"role": "ROLE_USER", "messageId": "m2",
                                                        "parts": [{"text": "a b"}]}}).encode(),
                                {"Content-Type": "application/json"})
            check(status == 200, "REST stream")
            rpc(url, "NoSuchMethod", {})

            status, headers, page = call(admin, "/metrics")
            check(status == 200, "GET /metrics: %d" % status)
            check(headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8",
                  "Content-Type " + headers["Content-Type"])
        finally:
            server.terminate()
            server.wait(timeout=20)
        check(server.returncode == 0, "serve exited %s" % server.returncode)

    families = {f.name: f for f in text_string_to_metric_families(page)}
    for name in re.findall(r"^# TYPE (\S+) ", page, re.M):
        check(("# HELP %s " % name) in page, name + " has no HELP")
    for f in families.values():
        check(f.name.startswith("toolnexus_"), f.name + ": not in the toolnexus_ namespace")
        check(f.documentation != "", f.name + ": no help text")
        if f.type == "counter":
            # The parser names a counter family without its _total suffix;
            # every sample must carry it.
            check(all(s.name == f.name + "_total" for s in f.samples), f.name + ": counter samples without _total")
        if f.type == "histogram":
            check(f.name.endswith("_seconds"), f.name + ": a duration histogram not in seconds")
            series = {}
            for s in f.samples:
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                series.setdefault(key, {"buckets": [], "count": None, "sum": None})
                if s.name.endswith("_bucket"):
                    series[key]["buckets"].append((float(s.labels["le"]), s.value))
                elif s.name.endswith("_count"):
                    series[key]["count"] = s.value
                elif s.name.endswith("_sum"):
                    series[key]["sum"] = s.value
            for key, h in series.items():
                counts = [v for _, v in sorted(h["buckets"])]
                check(counts == sorted(counts), f.name + str(key) + ": buckets not cumulative")
                check(sorted(h["buckets"])[-1][0] == float("inf"), f.name + str(key) + ": no +Inf bucket")
                check(counts[-1] == h["count"], f.name + str(key) + ": +Inf bucket != _count")
                check(h["sum"] is not None and h["sum"] >= 0, f.name + str(key) + ": no _sum")

    want = {
        "toolnexus_a2a_requests": "counter", "toolnexus_a2a_request_duration_seconds": "histogram",
        "toolnexus_store_operations": "counter", "toolnexus_store_operation_duration_seconds": "histogram",
        "toolnexus_store_errors": "counter", "toolnexus_store_cas_conflicts": "counter",
        "toolnexus_tasks_running": "gauge", "toolnexus_tasks_queued": "gauge", "toolnexus_streams_open": "gauge",
        "toolnexus_http_connections_open": "gauge", "toolnexus_ready": "gauge",
        "toolnexus_push_deliveries": "counter", "toolnexus_push_failures": "counter",
        "toolnexus_push_retries": "counter", "toolnexus_push_give_ups": "counter",
        "toolnexus_leases_settled": "counter", "toolnexus_change_feed": "gauge",
        "toolnexus_change_feed_gaps": "counter", "toolnexus_watch_rereads": "counter",
        "toolnexus_retention_records_read": "counter", "toolnexus_retention_deleted": "counter",
        "toolnexus_retention_expired": "counter",
    }
    for name, kind in want.items():
        check(name in families and families[name].type == kind, "%s: missing or not a %s" % (name, kind))

    def requests(**labels):
        return sum(s.value for s in families["toolnexus_a2a_requests"].samples
                   if all(s.labels.get(k) == v for k, v in labels.items()))

    check(requests(method="GetTask", dialect="1.0", transport="jsonrpc", code="200") == 1, "GetTask 1.0 jsonrpc")
    check(requests(method="GetTask", dialect="0.3", transport="jsonrpc", code="200") == 1, "tasks/get is GetTask 0.3")
    check(requests(method="GetTask", transport="rest", code="200") == 1, "REST GetTask 200")
    check(requests(method="GetTask", transport="rest", code="404") == 1, "REST GetTask 404")
    check(requests(method="SendStreamingMessage", transport="sse") == 1, "REST stream counted as sse")
    check(requests(method="other") == 1, "an unknown method is 'other'")
    check(requests(method="SendMessage", dialect="0.3") == 1, "message/send is SendMessage 0.3")
    if failures:
        print("metrics_exposition_test: %d failures" % len(failures), file=sys.stderr)
        return 1
    print("metrics_exposition_test: %d families parsed, all checks passed" % len(families))
    return 0


if __name__ == "__main__":
    sys.exit(main())
