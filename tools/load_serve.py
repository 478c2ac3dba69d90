#!/usr/bin/env python3
# /// script
# requires-python = ">=3.9"
# dependencies = []
# ///
"""Load test of a running `ktune serve`: N requests from C concurrent clients
(threads, the standard library's http.client, loopback only), each a
non-streaming /v1/completions of --max-tokens tokens. Reports requests/s,
p50/p99 latency of the requests answered 200, generated tokens/s, the status
counts, and the server's RSS (VmRSS from /proc/PID/status) before, in the middle
and after.

    tools/load_serve.py --url http://127.0.0.1:8080 --pid PID -n 200 -c 8 --max-tokens 16
"""

import argparse
import collections
import http.client
import json
import statistics
import threading
import time
import urllib.parse


def rss_kib(pid):
    if not pid:
        return None
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def one(host, port, body):
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=600)
    try:
        c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        status = r.status
    except OSError as e:
        return ("error:" + type(e).__name__, time.perf_counter() - t0, 0)
    finally:
        c.close()
    tokens = 0
    if status == 200:
        tokens = json.loads(data)["usage"]["completion_tokens"]
    return (status, time.perf_counter() - t0, tokens)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--pid", type=int, help="the server's process id (for its RSS)")
    ap.add_argument("-n", "--requests", type=int, default=200)
    ap.add_argument("-c", "--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--prompt", default="Write one sentence about the sea.")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("loopback only: give --url http://127.0.0.1:PORT")
    body = json.dumps({"prompt": a.prompt, "max_tokens": a.max_tokens, "temperature": 0})
    results, lock = [], threading.Lock()
    next_i = iter(range(a.requests))
    rss = {"before": rss_kib(a.pid)}

    def client():
        while True:
            with lock:
                i = next(next_i, None)
            if i is None:
                return
            r = one(u.hostname, u.port or 80, body)
            with lock:
                results.append(r)
                if len(results) == a.requests // 2:
                    rss["middle"] = rss_kib(a.pid)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    rss["after"] = rss_kib(a.pid)
    ok = sorted(lat for s, lat, _ in results if s == 200)
    q = lambda p: ok[min(len(ok) - 1, int(p * len(ok)))] if ok else float("nan")
    tokens = sum(n for _, _, n in results)
    out = {
        "requests": a.requests,
        "answered": len(results),
        "clients": a.clients,
        "max_tokens": a.max_tokens,
        "status": dict(collections.Counter(str(s) for s, _, _ in results)),
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(results) / wall, 2),
        "ok_per_s": round(len(ok) / wall, 2),
        "latency_p50_s": round(statistics.median(ok), 3) if ok else None,
        "latency_p99_s": round(q(0.99), 3) if ok else None,
        "generated_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1),
        "rss_kib": rss,
    }
    print(json.dumps(out, indent=1))
    lost = a.requests - len(results)
    errors = sum(1 for s, _, _ in results if s not in (200, 429))
    raise SystemExit(1 if lost or errors else 0)


if __name__ == "__main__":
    main()
