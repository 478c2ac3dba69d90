#!/usr/bin/env python3
"""Writes fuzz/seeds/<target>/, the fuzz targets' seed inputs, from the test
fixtures (standard library only; `tools/fuzz.sh seeds` runs it).

Each input is laid out as its target in src/fuzzing.rs reads it (parts that a
target takes together are separated by NUL bytes, text parts first):

    gguf         a GGUF model file (two fixture models: llama with a BPE
                 vocabulary, qwen2 with biases)
    safetensors  config.json NUL a safetensors file
    profile      the test profiles (tests/fixtures/profiles: a few kB each; the
                 shipped ones are 200 kB, too slow an input to fuzz)
    bundle       the test profiles in a bundle as `ktune profiles export`
                 writes it: zstd-compressed (by the zstd command), and in a zstd
                 frame of raw blocks, so that mutations reach the tar and
                 manifest readers instead of the decompressor
    tokenizer    a text NUL a GGUF vocabulary (SentencePiece: llama, gemma3)
    chat         template NUL prompt NUL bos NUL eos, for each fixture template
    cli          argv, NUL between arguments

    tools/fuzz_seeds.py
"""

import hashlib
import io
import json
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
SEEDS = ROOT / "fuzz" / "seeds"

TEXT = "The kernel reads 42 weights, 漢字 🦀.\n  <s> tabs\tand <|im_end|> specials"

ARGV = [
    ["run", "--model", "gemma3-1b", "--prompt", "hi", "--temperature", "0.8", "--top-k", "40", "--top-p", "0.9", "--seed", "7"],
    ["run", "--gguf", "m.gguf", "--chat", "--prompt", "hi", "--max-tokens", "64", "--context", "512", "--fusion", "qkv,gate_up"],
    ["run", "--model-dir", "d", "--tokens", "1,2,3", "--kv-dtype", "f16", "--weight-dtype", "q4_k", "--decode-chain", "8"],
    ["--device", "cpu", "tune", "--model", "llama-3.2-1b", "--budget", "30s", "--layers", "2", "--max-kld", "0.01"],
    ["bench", "--model", "gemma3-1b", "--profile", "a.yaml", "--rounds", "3"],
    ["eval", "--gguf", "m.gguf", "--file", "t.txt", "--ctx", "128", "--chunks", "2", "--reference", "cpu"],
    ["profiles", "import", "b.tar.zst", "--shipped"],
    ["diff-profiles", "a.yaml", "b.yaml", "--threshold", "5"],
    ["report", "a.yaml", "-o", "r.html"],
    ["kernels", "--verify", "--op", "gemv"],
]


def zstd_raw(data: bytes) -> bytes:
    """A zstd frame holding `data` in raw blocks: magic, a single-segment frame
    header with a 4-byte content size, no checksum."""
    out = bytearray(struct.pack("<I", 0xFD2FB528))
    out += bytes([0xA0]) + struct.pack("<I", len(data))
    block = 128 << 10
    chunks = [data[i : i + block] for i in range(0, len(data), block)] or [b""]
    for i, c in enumerate(chunks):
        last = i == len(chunks) - 1
        out += struct.pack("<I", int(last) | (0 << 1) | (len(c) << 3))[:3] + c
    return bytes(out)


def bundle_tar(profiles: list[Path]) -> bytes:
    """A bundle's tar: the manifest, then each profile under its key."""
    entries, files = [], []
    for p in profiles:
        text = p.read_bytes()
        key = hashlib.sha256(text).hexdigest()
        name = f"profiles/{key}.yaml"
        entries.append(
            {
                "key": key,
                "file": name,
                "sha256": key,
                "model": "smollm2-135m",
                "device_name": "fuzz",
                "fingerprint": "0" * 64,
                "kernel_set": "0" * 64,
                "e2e_seconds": 1.5,
            }
        )
        files.append((name, text))
    manifest = {"format": "ktune-bundle", "version": 1, "ktune_version": "0.1.0", "kernel_set": "0" * 64, "profiles": entries}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name, data in [("ktune-bundle.json", json.dumps(manifest, indent=2).encode())] + files:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write(target: str, name: str, data: bytes) -> None:
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def nul(*parts: bytes) -> bytes:
    return b"\0".join(parts)


def main() -> None:
    if SEEDS.exists():
        shutil.rmtree(SEEDS)

    for f in ["gguf/smollm2-tiny-q4_0.gguf", "gguf/qwen2-tiny-q8_0.gguf"]:
        write("gguf", Path(f).name, (FIX / f).read_bytes())

    st = FIX / "qwen2-tiny-sharded"
    write("safetensors", "qwen2-shard4", nul((st / "config.json").read_bytes(), (st / "model-00004-of-00004.safetensors").read_bytes()))

    profiles = sorted((FIX / "profiles").glob("*.yaml"))
    for p in profiles:
        write("profile", p.name, p.read_bytes())

    tar = bundle_tar(profiles)
    write("bundle", "compressed.tar.zst", subprocess.run(["zstd", "-q", "-c"], input=tar, capture_output=True, check=True).stdout)
    write("bundle", "raw-blocks.tar.zst", zstd_raw(tar))

    for f in ["spm/llama.gguf", "spm/gemma3.gguf", "spm/llama-noprefix.gguf"]:
        write("tokenizer", Path(f).name, nul(TEXT.encode(), (FIX / f).read_bytes()))

    for t in sorted((FIX / "chat_templates").glob("*.jinja")):
        write("chat", t.stem, nul(t.read_bytes(), TEXT.encode(), b"<s>", b"</s>"))

    for i, argv in enumerate(ARGV):
        write("cli", f"{i:02}-{argv[0].lstrip('-')}", nul(*(x.encode() for x in argv)))


if __name__ == "__main__":
    main()
