#!/usr/bin/env python3
"""llama.cpp's greedy continuation of a tools/real_gguf_reference.py prompt, as
a second opinion beside transformers'.

Reads the reference JSON, feeds its `prompt_text` (the prompt as transformers'
tokenizer encoded it, chat template included; a leading BOS token's text is
removed because llama-simple adds the file's BOS itself and parses special
tokens) to llama.cpp's `llama-simple` (greedy sampler, stops at end of
generation), and writes what it printed, its prompt token count against the
reference's, and the continuation next to transformers' text.

    target/venv-py/bin/python tools/llamacpp_greedy.py REF.json --model DIR_OR_FILE -o OUT.txt

llama-simple: $LLAMA_SIMPLE, else $LLAMACPP_BUILD/bin/llama-simple, else
target/llama.cpp-build/bin/llama-simple (tools/build_llamacpp.sh).
Standard library only.
"""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOS_TEXT = ("<bos>", "<s>", "<|begin_of_text|>")


def binary():
    if os.environ.get("LLAMA_SIMPLE"):
        return Path(os.environ["LLAMA_SIMPLE"])
    b = Path(os.environ.get("LLAMACPP_BUILD", ROOT / "target" / "llama.cpp-build")) / "bin" / "llama-simple"
    if not b.exists():
        sys.exit(f"{b} not found: run tools/build_llamacpp.sh, or set LLAMA_SIMPLE / LLAMACPP_BUILD")
    return b


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref", type=Path)
    ap.add_argument("--model", type=Path, required=True, help="the GGUF file, or the directory holding the reference's file")
    ap.add_argument("-o", "--out", type=Path, required=True)
    args = ap.parse_args()
    ref = json.loads(args.ref.read_text())
    model = args.model / ref["file"] if args.model.is_dir() else args.model
    prompt = ref["prompt_text"]
    for b in BOS_TEXT:
        if prompt.startswith(b):
            prompt = prompt[len(b):]
            break
    n = len(ref["generated"])
    p = subprocess.run([str(binary()), "-m", str(model), "-n", str(n), prompt], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"llama-simple failed ({p.returncode}):\n{p.stderr[-2000:]}")
    out = p.stdout
    m = re.search(r"prompt eval time =.*/\s*(\d+) tokens", p.stderr)
    d = re.search(r"main: decoded (\d+) tokens", p.stderr)
    n_prompt = int(m.group(1)) if m else None
    shown = out  # llama-simple prints the prompt pieces (BOS included), then each generated piece
    lines = [
        f"# llama-simple ({binary().name}), greedy, -n {n}, model {model.name}",
        f"# prompt (repr): {prompt!r}",
        f"# prompt tokens: llama.cpp {n_prompt}, transformers {len(ref['prompt_ids'])}"
        + ("" if n_prompt == len(ref["prompt_ids"]) else "  <-- DIFFERENT"),
        f"# decoded tokens: {d.group(1) if d else '?'} (llama-simple stops at end of generation)",
        f"# transformers continuation (repr): {ref['text']!r}",
        "# llama.cpp output (prompt, then continuation):",
        shown.rstrip("\n"),
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
