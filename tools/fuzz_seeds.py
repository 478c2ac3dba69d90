#!/usr/bin/env python3
"""Writes fuzz/seeds/<target>/, the fuzz targets' seed inputs, from the test
fixtures (standard library only; `tools/fuzz.sh seeds` runs it).

Each input is laid out as its target in src/fuzzing.rs reads it (parts that a
target takes together are separated by NUL bytes, text parts first):

    gguf         a GGUF model file, tiny ones written here: llama, qwen2 (with
                 biases) and gemma3, 1-2 layers at width 32, a 24-piece
                 SentencePiece vocabulary or a byte-level BPE one (smollm and
                 qwen2 splits), one block format a matrix, and each 256-element
                 block format as a 256-wide FFN's down projection. 10-22 kB: the test fixtures (80-135 kB)
                 ran ~300 inputs a second, too slow for 10 million
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


# GGUF value types (gguf.GGUFValueType).
U32, I32, F32, BOOL, STR, ARR = 4, 5, 6, 7, 8, 9
# ggml type ids and (elements, bytes) per block.
GGML = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24),
        "Q8_0": (8, 32, 34), "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176),
        "Q6_K": (14, 256, 210), "IQ4_NL": (20, 32, 18), "IQ4_XS": (23, 256, 136), "BF16": (30, 1, 2)}  # fmt: skip


def gguf_str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(v) -> bytes:
    """A typed GGUF value: bool, int (u32, i32 when negative), float (f32), str,
    or a list of one of those."""
    if isinstance(v, bool):
        return struct.pack("<I?", BOOL, v)
    if isinstance(v, int):
        return struct.pack("<Ii", I32, v) if v < 0 else struct.pack("<II", U32, v)
    if isinstance(v, float):
        return struct.pack("<If", F32, v)
    if isinstance(v, str):
        return struct.pack("<I", STR) + gguf_str(v)
    elem = gguf_value(v[0])[:4]
    return struct.pack("<I", ARR) + elem + struct.pack("<Q", len(v)) + b"".join(gguf_value(x)[4:] for x in v)


def gguf_file(meta: dict, tensors: list) -> bytes:
    """A GGUF v3 file: `meta` as key-values, `tensors` as (name, ggml dims
    [columns, rows], ggml type name), their data deterministic bytes (every
    16-bit block scale set to a small f16, so that the seed is a usable model)."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)))
    for k, v in meta.items():
        out += gguf_str(k) + gguf_value(v)
    data = bytearray()
    seed = 1
    for name, dims, ty in tensors:
        tid, elems, size = GGML[ty]
        n = 1
        for d in dims:
            n *= d
        nbytes = n // elems * size
        out += gguf_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", tid, len(data))
        if ty == "F32":
            blob = b"".join(struct.pack("<f", 0.5 + 0.01 * (i % 7)) for i in range(n))
        else:
            seed = hashlib.sha256(f"{name}{seed}".encode()).digest()
            blob = bytearray((hashlib.sha256(seed * (nbytes // 32 + 1)).digest() * (nbytes // 32 + 1))[:nbytes])
            scale = {"F16": struct.pack("<e", 0.03125), "BF16": struct.pack("<H", 0x3D00)}.get(ty, struct.pack("<e", 0.03125))
            for b in range(0, nbytes, 2 if elems == 1 else size):
                blob[b : b + 2] = scale
            blob = bytes(blob)
        data += blob + bytes(-len(blob) % 32)
    out += bytes(-len(out) % 32)
    return bytes(out + data)


# A SentencePiece vocabulary: pieces, scores, types (1 normal, 2 unknown, 3 control, 6 byte).
SPM = (
    [("<unk>", 2), ("<s>", 3), ("</s>", 3), ("<0x0A>", 6), ("<0xE6>", 6)]
    + [(p, 1) for p in ["\u2581", "\u2581t", "he", "\u2581the", "a", "e", "h", "k", "l", "n", "r", "s", "t", "w", "\u2581k", "er", "in", "\u2581w"]]
    + [("<|im_end|>", 3)]
)


def gpt2_bytes() -> list[str]:
    """GPT-2's byte-level alphabet: each byte as the character that stands for it."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def bpe_vocab(pre: str) -> dict:
    """A byte-level BPE vocabulary (`tokenizer.ggml.model = gpt2`): the 256 byte
    characters, three merges, three control tokens."""
    merges = ["\u0120 t", "h e", "\u0120t he"]
    tokens = gpt2_bytes() + ["\u0120t", "he", "\u0120the", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * (len(tokens) - 3) + [3, 3, 3],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": len(tokens) - 2,
        "tokenizer.ggml.eos_token_id": len(tokens) - 1,
    }


def spm_vocab() -> dict:
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [p for p, _ in SPM],
        "tokenizer.ggml.scores": [-float(i) for i in range(len(SPM))],
        "tokenizer.ggml.token_type": [t for _, t in SPM],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": True,
    }


def tiny_model(arch: str, layers: int, matrix_types: list[str], biases: bool = False, bpe: str | None = None, down: str | None = None) -> bytes:
    """A GGUF model of `arch` at width 32 (2 heads of 16, 1 KV head, FFN 32) with
    the SPM vocabulary, or a byte-level BPE one split as `bpe` says; the layers'
    matrices take `matrix_types` in turn. With `down`, the FFN is 256 wide and
    `ffn_down` (256 columns) is in that 256-element block format."""
    vocab = bpe_vocab(bpe) if bpe else spm_vocab()
    h, ffn, kv, v = 32, (256 if down else 32), 16, len(vocab["tokenizer.ggml.tokens"])
    a = arch
    meta = {
        "general.architecture": a,
        "general.alignment": 32,
        f"{a}.block_count": layers,
        f"{a}.context_length": 64,
        f"{a}.embedding_length": h,
        f"{a}.feed_forward_length": ffn,
        f"{a}.attention.head_count": 2,
        f"{a}.attention.head_count_kv": 1,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{a}.rope.freq_base": 10000.0,
        **vocab,
        "tokenizer.chat_template": "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant\n{% endif %}",
    }
    if a == "gemma3":
        meta |= {f"{a}.attention.sliding_window": 8, f"{a}.attention.key_length": 16, f"{a}.attention.value_length": 16}
    tensors = [("token_embd.weight", [h, v], "Q4_0"), ("output_norm.weight", [h], "F32")]
    types = iter(matrix_types * (7 * layers))
    for i in range(layers):
        p = f"blk.{i}."
        tensors += [(p + "attn_norm.weight", [h], "F32"), (p + "ffn_norm.weight", [h], "F32")]
        if a == "gemma3":
            tensors += [(p + n, [d], "F32") for n, d in [("post_attention_norm.weight", h), ("post_ffw_norm.weight", h), ("attn_q_norm.weight", 16), ("attn_k_norm.weight", 16)]]
        for name, dims in [("attn_q", [h, h]), ("attn_k", [h, kv]), ("attn_v", [h, kv]), ("attn_output", [h, h]), ("ffn_gate", [h, ffn]), ("ffn_up", [h, ffn]), ("ffn_down", [ffn, h])]:
            tensors.append((p + name + ".weight", dims, down if down and name == "ffn_down" else next(types)))
            if biases and name in ("attn_q", "attn_k", "attn_v"):
                tensors.append((p + name + ".bias", [dims[1]], "F32"))
    return gguf_file(meta, tensors)


def write(target: str, name: str, data: bytes) -> None:
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def logits_file(vocab: int, ctx: int, first: int, chunks: int, f16: bool) -> bytes:
    """A logits file (src/eval/logits_file.rs): header, token ids, rows of
    log-probabilities (a softmax of small made-up logits)."""
    import math

    rows = chunks * (ctx - 1 - first)
    out = bytearray(b"KTLOGPRB")
    out += struct.pack("<6IQ", 1, 1 if f16 else 0, vocab, ctx, first, chunks, rows)
    out += struct.pack(f"<{chunks * ctx}I", *[(7 * i + 3) % vocab for i in range(chunks * ctx)])
    for r in range(rows):
        logits = [math.sin(0.7 * r + 1.3 * v) for v in range(vocab)]
        lse = math.log(sum(math.exp(x) for x in logits))
        out += struct.pack(f"<{vocab}{'e' if f16 else 'f'}", *[x - lse for x in logits])
    return bytes(out)


def nul(*parts: bytes) -> bytes:
    return b"\0".join(parts)


def main() -> None:
    if SEEDS.exists():
        shutil.rmtree(SEEDS)

    write("gguf", "tiny-llama.gguf", tiny_model("llama", 1, ["Q8_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "F16", "BF16"]))
    write("gguf", "tiny-qwen2.gguf", tiny_model("qwen2", 2, ["Q4_0", "Q8_0"], biases=True, bpe="qwen2"))
    write("gguf", "tiny-smollm.gguf", tiny_model("llama", 1, ["Q4_0"], bpe="smollm"))
    write("gguf", "tiny-gemma3.gguf", tiny_model("gemma3", 1, ["Q8_0"]))
    for k in ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]:
        write("gguf", f"tiny-{k.lower()}.gguf", tiny_model("llama", 1, ["Q4_0"], down=k))

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

    write("logits", "f32-2chunks.bin", logits_file(16, 8, 4, 2, f16=False))
    write("logits", "f16-3chunks.bin", logits_file(24, 6, 2, 3, f16=True))
    write("logits", "f16-1row.bin", logits_file(5, 2, 0, 1, f16=True))


if __name__ == "__main__":
    main()
