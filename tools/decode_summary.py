#!/usr/bin/env python3
# /// script
# requires-python = ">=3.8"
# dependencies = []
# ///
"""One JSON summary of tools/device_gpu.sh's decode step (issue 31, section 7):
ktune's end-to-end benches (tuned profile and runtime default), PyTorch's
CUDA-graph decode and llama.cpp's Vulkan llama-bench, measured in the same call
on the same card, and the ratios between them. Standard library only.

    python3 tools/decode_summary.py WORK_DIR > decode.json

WORK_DIR holds what the step wrote: `bench-NAME.json` (`ktune bench --format
json`), `tune-NAME.json`, `source-NAME.txt` (the model's arguments),
`torch.json` (tools/bench_torch_decode.py), `llamabench-NAME.json` (llama-bench
`-o json`) with its stderr in `llamabench-NAME.err`, and `skipped.txt` (one line
per part that did not run, and why). Missing or broken files are reported, not
fatal: the summary of a step cut short holds what it measured.
"""

import json
import re
import sys
from pathlib import Path


def load(path):
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"{path.name}: {e}"
    if not text.strip():  # a command stopped at its limit before writing: skipped.txt says so
        return None, None
    try:
        return json.loads(text), None
    except (OSError, ValueError) as e:
        return None, f"{path.name}: {e}"


def med(x):
    return x.get("median") if isinstance(x, dict) else x


def ktune_entry(e):
    out = {
        "prefill_tok_s": med(e.get("prefill_tok_s")),
        "decode_tok_s": med(e.get("decode_tok_s")),
        "decode_tok_s_ci": (e.get("decode_tok_s") or {}).get("ci"),
        "decode_pct_of_bound": med(e.get("decode_pct_of_bound")),
    }
    c = e.get("decode_counters")
    if c:
        host = c.get("host_us") or {}
        out["host_us_per_token"] = host
        if host.get("total") is not None and host.get("wait") is not None:
            # the host's own work per token: everything but waiting for the GPU
            out["host_us_per_token_excl_wait"] = host["total"] - host["wait"]
        out["gpu_per_token"] = c.get("gpu")
    return out


def main():
    work = Path(sys.argv[1])
    errors = []
    res = {"device": None, "ktune": {}, "pytorch": None, "llamacpp": {}, "ratios": {}, "skipped": [], "errors": errors}
    settings = work / "settings.json"
    s, err = load(settings)
    if s:
        res["settings"] = s
    if err:
        errors.append(err)

    for f in sorted(work.glob("bench-*.json")):
        name = f.stem[len("bench-"):]
        b, err = load(f)
        if err:
            errors.append(err)
        if not b:
            continue
        res["device"] = res["device"] or b.get("device")
        k = {"model": b.get("model"), "read_gbps": med(b.get("read_gbps")), "entries": {}}
        src = work / f"source-{name}.txt"
        if src.exists():
            k["source"] = src.read_text().strip()
        for e in b.get("entries", []):
            key = "default" if e.get("name") == "default" else "tuned"
            k["entries"][key] = ktune_entry(e)
            k["decode_read_bytes"] = e.get("decode_read_bytes", k.get("decode_read_bytes"))
        t, err = load(work / f"tune-{name}.json")
        if err:
            errors.append(err)
        if isinstance(t, dict) and isinstance(t.get("profile"), dict):
            prof = t["profile"]
            tun = prof.get("tuning") or {}
            k["tune"] = {key: tun.get(key) for key in ("budget_s", "used_s", "strategy")}
            e2e = tun.get("end_to_end") or {}
            # the tune's own end-to-end check (its prompt and decode lengths), without every combination raced
            k["tune"]["end_to_end"] = {key: v for key, v in e2e.items() if key != "combinations"}
            k["tune"]["kernels"] = prof.get("kernels")
            k["tune"]["execution"] = prof.get("execution")
        if b.get("warnings"):
            k["warnings"] = b["warnings"]
        res["ktune"][name] = k

    t, err = load(work / "torch.json")
    if err:
        errors.append(err)
    if t:
        res["pytorch"] = {
            key: t.get(key)
            for key in ("device", "torch", "dtype", "shape", "decode_read_bytes", "copy_gbps", "best_mode", "decode_tok_s", "prefill_tok_s", "threads")
            if key in t
        }
        res["pytorch"]["modes"] = {
            m: {key: v for key, v in r.items() if key not in ("decode_s", "decode_sync_s")} for m, r in t.get("modes", {}).items()
        }

    for f in sorted(work.glob("llamabench-*.json")):
        name = f.stem[len("llamabench-"):]
        rows, err = load(f)
        if err:
            errors.append(err)
        if not isinstance(rows, list):
            continue
        pp = next((r for r in rows if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0), None)
        tg = next((r for r in rows if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0), None)
        first = pp or tg or {}
        lb = {key: first.get(key) for key in ("model_filename", "model_type", "model_size", "backends", "gpu_info", "n_gpu_layers", "flash_attn", "build_commit")}
        if pp:
            lb.update(prefill_tokens=pp["n_prompt"], prefill_tok_s=pp["avg_ts"], prefill_tok_s_stddev=pp["stddev_ts"])
        if tg:
            lb.update(decode_tokens=tg["n_gen"], decode_tok_s=tg["avg_ts"], decode_tok_s_stddev=tg["stddev_ts"])
        errf = work / f"llamabench-{name}.err"
        if errf.exists():
            # which device ggml-vulkan used (a CPU fallback would still print "Vulkan" as its backend)
            lb["vulkan_devices"] = [l.strip() for l in errf.read_text(errors="replace").splitlines() if re.match(r"\s*ggml_vulkan: (Found|\d+ =)", l)]
        res["llamacpp"][name] = lb

    sk = work / "skipped.txt"
    if sk.exists():
        res["skipped"] = [l for l in sk.read_text().splitlines() if l.strip()]

    # Ratios, decode tok/s: ktune (tuned, and the runtime default) over each anchor.
    def kt(name, entry):
        return ((res["ktune"].get(name) or {}).get("entries", {}).get(entry) or {}).get("decode_tok_s")

    torch_dec = (res["pytorch"] or {}).get("decode_tok_s")
    dt = (res["pytorch"] or {}).get("dtype", "")
    torch_name = "pytorch-" + {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}.get(dt, dt)
    pairs = [
        ("llama-q4_k_m", torch_name, torch_dec),
        ("llama-f16", torch_name, torch_dec),
        ("llama-q4_k_m", "llamacpp-q4_k_m", (res["llamacpp"].get("llama-q4_k_m") or {}).get("decode_tok_s")),
        ("llama-f16", "llamacpp-f16", (res["llamacpp"].get("llama-f16") or {}).get("decode_tok_s")),
        ("gemma-3-270m-q4_k_m", "llamacpp-gemma-3-270m-q4_k_m", (res["llamacpp"].get("gemma-3-270m-q4_k_m") or {}).get("decode_tok_s")),
    ]
    for name, anchor, ref in pairs:
        for entry in ("tuned", "default"):
            mine = kt(name, entry)
            if mine and ref:
                res["ratios"][f"ktune {name} {entry} / {anchor}"] = mine / ref
    lq = (res["llamacpp"].get("llama-q4_k_m") or {}).get("decode_tok_s")
    if lq and torch_dec:
        res["ratios"][f"llamacpp-q4_k_m / {torch_name}"] = lq / torch_dec
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
