#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = []
# ///
"""ktune against llama.cpp's own `llama-bench` on the same CPU and the same GGUF
files, in one run, rounds alternating, with each engine against the read-bandwidth
bound. Standard library only.

    tools/build_llamacpp.sh                      # llama-bench, native (-DGGML_NATIVE=ON), once
    tools/real_models.sh                         # or any GGUF files of your own
    cargo build --release
    python3 tools/bench_llamabench.py            # every target/real/*.gguf
    python3 tools/bench_llamabench.py --files target/real/SmolLM2-135M-Instruct.Q4_1.gguf --rounds 3

Per file:
 1. A tuned profile: `ktune tune --device cpu --gguf FILE --force` (tuned anew; --tune-budget,
    prefill/decode shaped like the benchmark's request). --no-tune measures the
    runtime default only.
 2. --rounds rounds, alternating: `llama-bench -m FILE -t THREADS -p P -n N -r 1
    -o json` (its prompt-processing and token-generation rates), then `ktune bench
    --gguf FILE --profile TUNED` (the tuned profile and the runtime default, each
    one prefill of P tokens and N decode steps a round, three rounds: its medians).
 3. Ratios ktune / llama.cpp per round; the report gives their median and range.
 4. Bound: the read bandwidth `ktune bench` measures in each round (`read_gbps`:
    a parallel read of 256 MiB on all threads, best of 5, between its samples)
    over the bytes a decoded token reads (ktune's own count, `weight_bytes` of
    `ktune run`: every matrix as stored plus the LM head; the same file for both
    engines), as tokens per second; each engine's decode rate in a round as a
    share of that round's bound (the machine's bandwidth drifts with its load).

 5. Greedy tokens side by side: --greedy-tokens tokens of --greedy-prompt from
    llama.cpp's `llama-simple` (greedy; it prints the prompt, then the pieces)
    and from `ktune run --prompt ... --profile TUNED`, as text (llama-simple
    prints no ids): identical, or where they first differ. A difference after
    a near-tie of two logits is expected between engines whose arithmetic
    differs (int8 activations, another summation order); tests/runtime_gguf.rs
    checks ktune's ids against transformers' with that rule.

Prints a markdown table and writes --out (JSON). Run it on a quiet machine: both
engines use every thread they are given.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(cmd, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(map(str, cmd))}\n{p.stderr[-2000:]}")
    return p.stdout


def llama_round(bench, model, threads, p, n):
    out = json.loads(run([bench, "-m", model, "-t", threads, "-p", p, "-n", n, "-r", 1, "-o", "json"]))
    pp = next(r["avg_ts"] for r in out if r["n_prompt"] > 0 and r["n_gen"] == 0)
    tg = next(r["avg_ts"] for r in out if r["n_gen"] > 0 and r["n_prompt"] == 0)
    return pp, tg


def ktune_round(ktune, model, profile, p, n):
    cmd = [ktune, "bench", "--device", "cpu", "--gguf", model, "--rounds", 3, "--prefill-tokens", p, "--decode-tokens", n, "--format", "json"]
    if profile:
        cmd += ["--profile", profile]
    out = json.loads(run(cmd))
    res = {"read_gbps": out["read_gbps"]["median"]}
    for e in out["entries"]:
        key = "default" if e["name"] == "default" else "tuned"
        res[key] = (e["prefill_tok_s"]["median"], e["decode_tok_s"]["median"])
    return res


def greedy(a, model, profile):
    """(llama.cpp's continuation, ktune's) of a.greedy_prompt as text."""
    simple = Path(a.llama_bench).parent / "llama-simple"
    out = run([simple, "-m", model, "-n", a.greedy_tokens, a.greedy_prompt])
    # llama-simple echoes the prompt (a BOS piece first when the file adds one).
    i = out.find(a.greedy_prompt)
    llama = out[i + len(a.greedy_prompt):] if i >= 0 else out
    cmd = [a.ktune, "run", "--device", "cpu", "--gguf", model, "--prompt", a.greedy_prompt, "--max-tokens", a.greedy_tokens, "--format", "json"]
    if profile:
        cmd += ["--profile", profile]
    r = json.loads(run(cmd))
    return llama.rstrip("\n"), r.get("text") or ""


def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", nargs="*", help="GGUF files (default: target/real/*.gguf)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--tune-budget", default="120s")
    ap.add_argument("--no-tune", action="store_true", help="measure the runtime default only")
    ap.add_argument("--ktune", default=str(ROOT / "target/release/ktune"))
    ap.add_argument("--llama-bench", default=str(Path(os.environ.get("LLAMACPP_BUILD", ROOT / "target/llama.cpp-build")) / "bin/llama-bench"))
    ap.add_argument("--out", default=str(ROOT / "target/bench-llamabench/summary.json"))
    ap.add_argument("--greedy-prompt", default="The capital of France is")
    ap.add_argument("--greedy-tokens", type=int, default=16, help="0: no greedy comparison")
    a = ap.parse_args()
    files = a.files or sorted(str(p) for p in (ROOT / "target/real").glob("*.gguf"))
    if not files:
        sys.exit("no GGUF files: pass --files or run tools/real_models.sh")
    for tool in (a.ktune, a.llama_bench):
        if not Path(tool).exists():
            sys.exit(f"{tool} is missing: cargo build --release / tools/build_llamacpp.sh")
    build = Path(a.llama_bench).parent.parent / "build-info.txt"
    summary = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"),
        "threads": a.threads,
        "llama_cpp": build.read_text().splitlines()[0] if build.exists() else "?",
        "prompt": a.prompt,
        "gen": a.gen,
        "rounds": a.rounds,
        "files": [],
    }
    os.environ["RAYON_NUM_THREADS"] = str(a.threads)
    for f in files:
        name = Path(f).name
        print(f"== {name}", file=sys.stderr)
        profile, profile_gbps = None, None
        if not a.no_tune:
            # --force: a profile cached by an older build would not measure this one.
            t = json.loads(run([a.ktune, "tune", "--device", "cpu", "--gguf", f, "--budget", a.tune_budget, "--prefill-tokens", a.prompt, "--force", "--format", "json"]))
            profile = t["path"]
            m = re.search(r"read_gbps:\s*([0-9.eE+-]+)", Path(profile).read_text())
            profile_gbps = float(m.group(1)) if m else None
        r = json.loads(run([a.ktune, "run", "--device", "cpu", "--gguf", f, "--prompt", "Hi", "--max-tokens", 1, "--format", "json"]))
        weight_bytes = r["weight_bytes"]
        rows = {"llama": [], "tuned": [], "default": []}
        gbps = []
        for i in range(a.rounds):
            rows["llama"].append(llama_round(a.llama_bench, f, a.threads, a.prompt, a.gen))
            k = ktune_round(a.ktune, f, profile, a.prompt, a.gen)
            gbps.append(k.pop("read_gbps"))
            for key, v in k.items():
                rows[key].append(v)
            print(f"   round {i + 1}: llama {rows['llama'][-1]}, ktune {k}, read {gbps[-1]:.1f} GB/s", file=sys.stderr)
        bounds = [g * 1e9 / weight_bytes for g in gbps]
        entry = {
            "file": name,
            "weight_bytes": weight_bytes,
            "read_gbps": spread(gbps),
            "bound_tok_s": spread(bounds),
            "profile_read_gbps": profile_gbps,
            "profile": profile,
        }
        for eng in ("llama", "tuned", "default"):
            if rows[eng]:
                entry[eng] = {
                    "prefill": spread([p for p, _ in rows[eng]]),
                    "decode": spread([d for _, d in rows[eng]]),
                    "decode_pct_of_bound": spread([100 * d / b for (_, d), b in zip(rows[eng], bounds)]),
                }
        for eng in ("tuned", "default"):
            if rows[eng]:
                entry[f"{eng}_vs_llama"] = {
                    "prefill": spread([k[0] / l[0] for k, l in zip(rows[eng], rows["llama"])]),
                    "decode": spread([k[1] / l[1] for k, l in zip(rows[eng], rows["llama"])]),
                }
        if a.greedy_tokens > 0:
            llama_text, ktune_text = greedy(a, f, profile)
            same = next((i for i, (x, y) in enumerate(zip(llama_text, ktune_text)) if x != y), min(len(llama_text), len(ktune_text)))
            entry["greedy"] = {
                "prompt": a.greedy_prompt,
                "llama": llama_text,
                "ktune": ktune_text,
                "identical": llama_text == ktune_text,
                "common_prefix_chars": same,
            }
        summary["files"].append(entry)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(summary, indent=1))
    print(f"{summary['cpu']}, {a.threads} threads, {summary['llama_cpp']}, pp{a.prompt}/tg{a.gen}, {a.rounds} alternating rounds (median [min-max])\n")
    fmt = lambda s, p=1: f"{s['median']:.{p}f} [{s['min']:.{p}f}-{s['max']:.{p}f}]"
    print("Read bound per file (GB/s, measured by `ktune bench` each round): " + ", ".join(f"{e['file']} {fmt(e['read_gbps'])}" for e in summary["files"]) + "\n")
    print("| file | engine | prefill tok/s | decode tok/s | prefill vs llama.cpp | decode vs llama.cpp | decode % of bound |")
    print("|---|---|---|---|---|---|---|")
    for e in summary["files"]:
        for eng in ("llama", "tuned", "default"):
            if eng not in e:
                continue
            vs = e.get(f"{eng}_vs_llama")
            pct = e[eng]["decode_pct_of_bound"]
            print(
                f"| {e['file']} | {'llama.cpp' if eng == 'llama' else 'ktune ' + eng} | {fmt(e[eng]['prefill'])} | {fmt(e[eng]['decode'])} | "
                f"{fmt(vs['prefill'], 2) + 'x' if vs else '-'} | {fmt(vs['decode'], 2) + 'x' if vs else '-'} | {fmt(pct, 0)}% |"
            )
    if any("greedy" in e for e in summary["files"]):
        print(f"\nGreedy continuations of {a.greedy_prompt!r} ({a.greedy_tokens} tokens; ktune with the tuned profile)\n")
        print("| file | llama.cpp | ktune | same |")
        print("|---|---|---|---|")
        for e in summary["files"]:
            g = e.get("greedy")
            if g:
                cell = lambda t: repr(t).replace("|", "\\|")
                verdict = "identical" if g["identical"] else f"first {g['common_prefix_chars']} characters"
                print(f"| {e['file']} | {cell(g['llama'])} | {cell(g['ktune'])} | {verdict} |")
    print(f"\nwritten {a.out}")


if __name__ == "__main__":
    main()
