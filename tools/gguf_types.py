#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = ["gguf==0.19.0", "numpy==2.4.6"]
# ///
"""Lists what a GGUF file holds, as the `gguf` package's GGUFReader reads it:
architecture, file type, tokenizer model/pre, add_space_prefix, add_bos_token,
whether a chat template is present, and the tensor types (count per type, and
per type the tensor names with the `blk.N.` prefix folded).

    target/venv-py/bin/python tools/gguf_types.py FILE.gguf [FILE.gguf ...]
    target/venv-py/bin/python tools/gguf_types.py --json FILE.gguf   # machine-readable
"""

import argparse
import json
import re
from collections import Counter, defaultdict

from gguf import GGUFReader


def field(r, key):
    f = r.fields.get(key)
    if f is None:
        return None
    v = f.contents()
    return v


def describe(path):
    r = GGUFReader(path)
    arch = field(r, "general.architecture")
    counts = Counter()
    names = defaultdict(set)
    for t in r.tensors:
        ty = t.tensor_type.name
        counts[ty] += 1
        names[ty].add(re.sub(r"^blk\.\d+\.", "blk.N.", t.name))
    tmpl = field(r, "tokenizer.chat_template")
    return {
        "file": path,
        "architecture": arch,
        "name": field(r, "general.name"),
        "file_type": field(r, "general.file_type"),
        "tokenizer.ggml.model": field(r, "tokenizer.ggml.model"),
        "tokenizer.ggml.pre": field(r, "tokenizer.ggml.pre"),
        "tokenizer.ggml.add_space_prefix": field(r, "tokenizer.ggml.add_space_prefix"),
        "tokenizer.ggml.add_bos_token": field(r, "tokenizer.ggml.add_bos_token"),
        "vocab": len(field(r, "tokenizer.ggml.tokens") or []),
        "chat_template": None if tmpl is None else f"present ({len(tmpl)} chars)",
        "tensor_types": dict(counts.most_common()),
        "tensors_by_type": {k: sorted(v) for k, v in names.items()},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = [describe(p) for p in args.files]
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for d in out:
        print(d["file"])
        for k, v in d.items():
            if k in ("file", "tensors_by_type"):
                continue
            print(f"  {k}: {v}")
        for ty, ns in d["tensors_by_type"].items():
            print(f"  {ty}: {', '.join(ns)}")


if __name__ == "__main__":
    main()
