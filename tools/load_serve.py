#!/usr/bin/env python3
# /// script
# requires-python = ">=3.9"
# dependencies = []
# ///
"""Load test of a running OpenAI-style server (`ktune serve`, `llama-server`):
N requests from C concurrent clients (threads, the standard library's
http.client, loopback only), each a /v1/completions of --max-tokens tokens.
Reports requests/s, generated tokens/s (aggregate), p50/p99 latency of the
requests answered 200, the status counts, and the server's RSS (VmRSS from
/proc/PID/status) before, in the middle and after.

With --stream each request is streamed (server-sent events): it also reports
p50/p99 time to first token and inter-token latency (the gaps between text
events). With --system-tokens S every prompt starts with the same system
prompt of about S words (a server with a prefix cache prefills it once) and
--mixed gives the requests user texts of different lengths. With a list of
clients (-c 1,2,4,8,16) each runs in turn, one JSON object a line.

With --alternate URL2 the requests go in waves of C at once (-c C, one
number), each wave to both servers, one after the other (the order swapped
every wave), so the two are measured seconds apart and a change of the
machine's speed falls on both; it reports each server's tokens/s (over its
waves' wall time) and time to first token over the run and the ratios of
the waves (URL's over URL2's) in blocks of --block waves: their median and
range. A wave starts its C requests together and ends with the last, so its
rate is a little under a continuous load's.

    tools/load_serve.py --url http://127.0.0.1:8080 --pid PID -n 200 -c 8 --max-tokens 16
    tools/load_serve.py --url http://127.0.0.1:8080 -c 1,8,16 --stream --system-tokens 512 --mixed
    tools/load_serve.py --url http://127.0.0.1:8080 --alternate http://127.0.0.1:8081 -c 1 -n 160 --block 16 --stream
"""

import argparse
import collections
import http.client
import json
import statistics
import threading
import time
import urllib.parse

WORDS = ("the sea and its tides keep the harbour town awake while ships come home "
         "from distant islands carrying salt fish rope and stories").split()


def rss_kib(pid):
    if not pid:
        return None
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def one(host, port, body, stream):
    """(status, latency s, generated tokens, time to first text s, gaps s)."""
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=600)
    first, gaps, tokens, status = None, [], 0, 0
    try:
        c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        status = r.status
        if not stream or status != 200:
            data = r.read()
            if status == 200:
                tokens = json.loads(data)["usage"]["completion_tokens"]
        else:
            last, events = None, 0
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if ev.get("usage"):
                    tokens = ev["usage"].get("completion_tokens", tokens)
                text = "".join(ch.get("text") or "" for ch in ev.get("choices") or [])
                if text:
                    now = time.perf_counter()
                    events += 1
                    if first is None:
                        first = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
            tokens = tokens or events
    except OSError as e:
        return ("error:" + type(e).__name__, time.perf_counter() - t0, 0, None, [])
    finally:
        c.close()
    return (status, time.perf_counter() - t0, tokens, first, gaps)


def prompt_of(i, a):
    system = " ".join(WORDS[j % len(WORDS)] for j in range(a.system_tokens))
    n = 8 + (i * 37) % 120 if a.mixed else 8
    user = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(n))
    return (system + "\n\n" if system else "") + a.prompt + " " + user


def body_of(i, a):
    """Request `i`'s JSON body: its prompt, the run's settings, its seed."""
    body = {"prompt": prompt_of(i, a), "max_tokens": a.max_tokens, "temperature": a.temperature, "ignore_eos": True}
    if a.temperature > 0:
        body["seed"] = i
    if a.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body)


def run(a, u, clients):
    results, lock = [], threading.Lock()
    next_i = iter(range(a.requests))
    rss = {"before": rss_kib(a.pid)}

    def client():
        while True:
            with lock:
                i = next(next_i, None)
            if i is None:
                return
            r = one(u.hostname, u.port or 80, body_of(i, a), a.stream)
            with lock:
                results.append(r)
                if len(results) == a.requests // 2:
                    rss["middle"] = rss_kib(a.pid)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    rss["after"] = rss_kib(a.pid)
    ok = [r for r in results if r[0] == 200]
    lat = sorted(r[1] for r in ok)
    ttft = sorted(r[3] for r in ok if r[3] is not None)
    itl = sorted(g for r in ok for g in r[4])
    q = lambda xs, p: round(xs[min(len(xs) - 1, int(p * len(xs)))], 4) if xs else None
    tokens = sum(r[2] for r in results)
    out = {
        "requests": a.requests,
        "answered": len(results),
        "clients": clients,
        "max_tokens": a.max_tokens,
        "status": dict(collections.Counter(str(r[0]) for r in results)),
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(results) / wall, 2),
        "ok_per_s": round(len(ok) / wall, 2),
        "latency_p50_s": round(statistics.median(lat), 3) if lat else None,
        "latency_p99_s": q(lat, 0.99),
        "ttft_p50_s": q(ttft, 0.5),
        "ttft_p99_s": q(ttft, 0.99),
        "itl_p50_s": q(itl, 0.5),
        "itl_p99_s": q(itl, 0.99),
        "generated_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1),
        "rss_kib": rss,
    }
    lost = a.requests - len(results)
    errors = sum(1 for r in results if r[0] not in (200, 429))
    return out, lost or errors


def alternate(a, u, v, clients):
    """Waves of `clients` concurrent requests, each wave to `u` and then the
    same requests to `v` (the order swapped every wave): per server its
    tokens/s (tokens over the waves' wall time) and time to first token p50
    over the run, and the ratios (u over v) of blocks of `a.block` waves."""
    def wave(x, bodies):
        """(tokens, wall s, times to first token, statuses) of one wave."""
        results = [None] * len(bodies)

        def client(j):
            results[j] = one(x.hostname, x.port or 80, bodies[j], a.stream)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(j,)) for j in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        return (sum(r[2] for r in results), wall, [r[3] for r in results if r[3] is not None], [r[0] for r in results])

    waves = []
    for w in range(a.requests // clients):
        bodies = [body_of(w * clients + j, a) for j in range(clients)]
        if w % 2 == 0:
            waves.append((wave(u, bodies), wave(v, bodies)))
        else:
            second = wave(v, bodies)
            waves.append((wave(u, bodies), second))
    bad = sum(1 for p in waves for r in p for st in r[3] if st != 200)
    rate = lambda ws: sum(w[0] for w in ws) / sum(w[1] for w in ws)
    ttft = lambda ws: statistics.median([t for w in ws for t in w[2]] or [float("nan")]) if a.stream else None
    blocks = [waves[b : b + a.block] for b in range(0, len(waves) - a.block + 1, a.block)]
    ratios = sorted(rate([p[0] for p in bl]) / rate([p[1] for p in bl]) for bl in blocks)
    firsts = sorted(ttft([p[0] for p in bl]) / ttft([p[1] for p in bl]) for bl in blocks) if a.stream else []
    out = {
        "clients": clients,
        "waves": len(waves),
        "block": a.block,
        "status_errors": bad,
        "tokens_per_s": [round(rate([p[0] for p in waves]), 2), round(rate([p[1] for p in waves]), 2)],
        "ttft_p50_s": [ttft([p[0] for p in waves]), ttft([p[1] for p in waves])] if a.stream else None,
        "rate_ratio_blocks": {"median": round(statistics.median(ratios), 4), "min": round(ratios[0], 4), "max": round(ratios[-1], 4), "all": [round(r, 4) for r in ratios]} if ratios else None,
        "ttft_ratio_blocks": {"median": round(statistics.median(firsts), 4), "min": round(firsts[0], 4), "max": round(firsts[-1], 4)} if firsts else None,
    }
    return out, bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--pid", type=int, help="the server's process id (for its RSS)")
    ap.add_argument("-n", "--requests", type=int, default=200, help="requests per concurrency")
    ap.add_argument("-c", "--clients", default="8", help="concurrent clients, or a comma-separated list")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--prompt", default="Write one sentence about the sea.")
    ap.add_argument("--stream", action="store_true", help="stream: time to first token and inter-token latency")
    ap.add_argument("--system-tokens", type=int, default=0, help="a shared system prompt of about this many words")
    ap.add_argument("--mixed", action="store_true", help="user texts of different lengths")
    ap.add_argument("--alternate", metavar="URL2", help="a second server: waves of -c requests, each to both in turn (paired rates)")
    ap.add_argument("--block", type=int, default=16, help="with --alternate: waves a block of the ratios")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy); above 0 each request seeded with its number")
    a = ap.parse_args()
    def loopback(url, flag):
        x = urllib.parse.urlparse(url)
        if x.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit(f"loopback only: give {flag} http://127.0.0.1:PORT")
        return x

    u = loopback(a.url, "--url")
    if a.alternate:
        v = loopback(a.alternate, "--alternate")
        if not a.clients.isdigit():
            raise SystemExit(f"--alternate takes one number of clients, not -c {a.clients}")
        clients = int(a.clients)
        if clients < 1 or a.block < 1 or a.requests < a.block * clients:
            raise SystemExit(f"--alternate needs at least one block: -n {a.requests} is fewer than --block {a.block} waves of -c {clients}")
        out, bad = alternate(a, u, v, clients)
        print(json.dumps(out, indent=1))
        raise SystemExit(1 if bad else 0)
    failed = False
    lists = [int(c) for c in a.clients.split(",")]
    for clients in lists:
        out, bad = run(a, u, clients)
        print(json.dumps(out) if len(lists) > 1 else json.dumps(out, indent=1), flush=True)
        failed |= bool(bad)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
