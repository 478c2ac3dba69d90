#!/usr/bin/env python3
"""Records llama.cpp's own tokenization of a few strings by every GGUF fixture
whose vocabulary llama.cpp loads, into tests/fixtures/gguf/llama_tokenize.json:
what tests/it/runtime_gguf.rs holds ktune's GGUF tokenizers (each file's
`tokenizer.ggml.pre` pre-split) to. Standard library only.

    LLAMACPP_TARGETS=llama-tokenize tools/build_llamacpp.sh
    python3 tools/record_gguf_tokens.py [--llama-tokenize PATH]
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GGUF = ROOT / "tests" / "fixtures" / "gguf"
DEFAULT_TOKENIZE = ROOT / "target" / "llama.cpp-build" / "bin" / "llama-tokenize"

# Digits alone and in runs, spaces, a tab, a newline, contractions, punctuation,
# accents: where the pre-splits differ.
STRINGS = [
    "Once upon a time 123",
    "Hello world!! 2024-12-02 it's 3.14",
    "  spaces\tand\nnewlines  ",
    "cafe naive 12345678 don't WE'LL",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "Kernels are tuned per device; caf\u00e9 na\u00efve",
]


def tokenize(tool: Path, model: Path, text: str):
    """llama.cpp's ids of `text` without a BOS, or None when it cannot load `model`."""
    out = subprocess.run(
        [str(tool), "-m", str(model), "-p", text, "--ids", "--no-bos", "--log-disable"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-tokenize", type=Path, default=DEFAULT_TOKENIZE)
    args = ap.parse_args()
    if not args.llama_tokenize.is_file():
        sys.exit(f"no {args.llama_tokenize}: run LLAMACPP_TARGETS=llama-tokenize tools/build_llamacpp.sh")
    files = {}
    for model in sorted(GGUF.glob("*.gguf")):
        ids = [tokenize(args.llama_tokenize, model, s) for s in STRINGS]
        if any(i is None for i in ids):
            print(f"{model.name}: llama.cpp does not load it, left out")
            continue
        files[model.name] = ids
        print(f"{model.name}: {sum(map(len, ids))} ids")
    about = "llama.cpp's llama-tokenize --ids --no-bos of each string by each file (tools/record_gguf_tokens.py)"
    doc = {"about": about, "strings": STRINGS, "files": files}
    (GGUF / "llama_tokenize.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
