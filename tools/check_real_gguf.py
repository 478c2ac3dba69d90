#!/usr/bin/env python3
"""Checks ktune's greedy tokens on real published GGUF files against the
references of tools/real_gguf_reference.py (transformers loading the same file).

For each REF.json in a reference directory (tools/real_models.sh writes them to
REAL/ref/), runs `ktune run --gguf FILE --prompt ... [--chat] --ignore-eos
--max-tokens N --format json` on each device asked for and compares the prompt
ids and the generated ids up to the reference's first near tie (where another
engine may fairly pick the other token). A Gemma file without a chat template
gets tests/fixtures/chat_templates/gemma3.jinja (the reference built the same
Gemma turns). Exit 1 on any mismatch. Standard library only.

    python3 tools/check_real_gguf.py --real target/real --ktune target/release/ktune --device cpu --device vulkan
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real", default=str(ROOT / "target" / "real"))
    ap.add_argument("--ktune", default=str(ROOT / "target" / "release" / "ktune"))
    ap.add_argument("--device", action="append", default=None)
    a = ap.parse_args()
    real = Path(a.real)
    failures = 0
    for ref_path in sorted((real / "ref").glob("*.json")):
        ref = json.loads(ref_path.read_text())
        model = real / ref["file"]
        if not model.exists():
            print(f"skip {ref_path.name}: {model} missing")
            continue
        n = len(ref["generated"])
        tie = ref.get("first_near_tie_step")
        upto = n if tie is None else tie
        for dev in a.device or ["cpu"]:
            cmd = [a.ktune, "run", "--device", dev, "--gguf", str(model), "--prompt", ref["prompt"],
                   "--max-tokens", str(n), "--ignore-eos", "--format", "json"]
            if ref.get("chat"):
                cmd.append("--chat")
                if ref.get("chat_template_source") != "file":
                    cmd += ["--chat-template", str(ROOT / "tests/fixtures/chat_templates/gemma3.jinja")]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"FAIL {ref_path.stem} [{dev}]: exit {out.returncode}: {out.stderr.strip()[:300]}")
                failures += 1
                continue
            got = json.loads(out.stdout)
            ok_prompt = got["prompt_ids"] == ref["prompt_ids"]
            ok_gen = got["generated"][:upto] == ref["generated"][:upto]
            verdict = "ok  " if ok_prompt and ok_gen else "FAIL"
            failures += 0 if ok_prompt and ok_gen else 1
            same = sum(1 for x, y in zip(got["generated"], ref["generated"]) if x == y)
            print(f"{verdict} {ref_path.stem} [{dev}]: prompt ids {'equal' if ok_prompt else 'DIFFER'} ({len(ref['prompt_ids'])}), "
                  f"generated {same}/{n} equal, compared up to step {upto} (first near tie: {tie}); "
                  f"decode {got['decode_tokens_per_sec']:.1f} tok/s; text {got.get('text', '')!r}")
            if not ok_prompt:
                print(f"     ktune prompt {got['prompt_ids']}\n     ref   prompt {ref['prompt_ids']}")
            if not ok_gen:
                print(f"     ktune {got['generated']}\n     ref   {ref['generated']}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
