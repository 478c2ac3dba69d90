#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = ["gguf==0.19.0", "numpy==2.4.6"]
# ///
"""Writes tests/fixtures/gguf/blocks.gguf: raw ggml blocks of every block format
ktune reads, and their dequantization by the `gguf` package
(`gguf.quants.dequantize`, a numpy port of ggml's reference dequantizers).

For each type T in TYPES, two tensors:

    t              (T lower case, e.g. `q4_k`) 3 rows x 512 columns stored as
                   raw T blocks (random bytes, seeded)
    t.expected     F32, 3 x 512: gguf.quants.dequantize(raw, T), stored as f32
                   so every value's bits are kept exactly

Every f16 field of a block (d, and dmin / m where the format has one) is
overwritten with a finite random f16 of magnitude in [1e-3, 1] (log-uniform),
with a random sign, so no value decodes to NaN or infinity; block 1 of row 1
has d = 0. The other bytes (quants, packed scales, IQ4_XS's u16 scales_h)
stay random. The script checks that every expected array is finite.

Metadata: `ktune.fixture.gguf_version` (the gguf package that dequantized),
`ktune.fixture.seed`.

Set up the repo's tools venv once, then run:

    python3 -m venv target/venv-py && target/venv-py/bin/pip install -r tools/requirements.txt
    target/venv-py/bin/python tools/make_block_fixture.py           # writes the file
    target/venv-py/bin/python tools/make_block_fixture.py --check   # rereads it, recomputes, compares

(or `uv run tools/make_block_fixture.py`: the inline metadata above pins the
same gguf and numpy).
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFWriter
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "gguf" / "blocks.gguf"
ROWS, COLS = 3, 512
SEED = 20261124

# Byte offsets of the f16 fields in one block: (d offsets, min offsets).
F16_FIELDS = {
    QT.Q4_0: ([0], []),
    QT.Q4_1: ([0], [2]),
    QT.Q5_0: ([0], []),
    QT.Q5_1: ([0], [2]),
    QT.Q8_0: ([0], []),
    QT.Q2_K: ([80], [82]),
    QT.Q3_K: ([108], []),
    QT.Q4_K: ([0], [2]),
    QT.Q5_K: ([0], [2]),
    QT.Q6_K: ([208], []),
    QT.IQ4_NL: ([0], []),
    QT.IQ4_XS: ([0], []),
}
TYPES = list(F16_FIELDS)


def random_f16(rng, n):
    mag = np.exp(rng.uniform(np.log(1e-3), np.log(1.0), n))
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return (mag * sign).astype(np.float16)


def raw_blocks(rng, qtype):
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    assert COLS % block_elems == 0
    nblocks = COLS // block_elems
    raw = rng.integers(0, 256, (ROWS, nblocks, block_bytes), dtype=np.uint8)
    d_offs, m_offs = F16_FIELDS[qtype]
    for off in d_offs + m_offs:
        vals = random_f16(rng, ROWS * nblocks).reshape(ROWS, nblocks)
        raw[:, :, off:off + 2] = vals.view(np.uint8).reshape(ROWS, nblocks, 2)
    # one block with d = 0 (row 1, block 1; for 512 columns every type has >= 2 blocks per row)
    for off in d_offs:
        raw[1, 1, off:off + 2] = 0
    return raw.reshape(ROWS, nblocks * block_bytes)


def build():
    rng = np.random.default_rng(SEED)
    out = {}
    for qtype in TYPES:
        raw = raw_blocks(rng, qtype)
        exp = dequantize(raw, qtype)
        assert exp.shape == (ROWS, COLS) and exp.dtype == np.float32, (qtype.name, exp.shape, exp.dtype)
        if not np.isfinite(exp).all():
            sys.exit(f"{qtype.name}: dequantized values are not all finite")
        out[qtype] = (raw, exp)
    return out


def write(path, blocks):
    w = GGUFWriter(str(path), "ktune-blocks")
    w.add_string("ktune.fixture.gguf_version", version())
    w.add_uint32("ktune.fixture.seed", SEED)
    for qtype, (raw, exp) in blocks.items():
        name = qtype.name.lower()
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        w.add_tensor(f"{name}.expected", exp.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def version():
    from importlib.metadata import version as v
    return v("gguf")


def check(path, blocks):
    r = GGUFReader(str(path))
    tensors = {t.name: t for t in r.tensors}
    bad = []
    for qtype, (raw, exp) in blocks.items():
        name = qtype.name.lower()
        t, e = tensors[name], tensors[f"{name}.expected"]
        stored_raw = np.asarray(t.data).reshape(raw.shape)
        stored_exp = np.asarray(e.data).reshape(ROWS, COLS)
        if t.tensor_type != qtype or not np.array_equal(stored_raw, raw):
            bad.append(f"{name}: stored blocks differ")
        if not np.array_equal(stored_exp.view(np.uint32), exp.view(np.uint32)):
            bad.append(f"{name}.expected: bits differ")
        redo = dequantize(stored_raw, qtype)
        if not np.array_equal(redo.view(np.uint32), stored_exp.view(np.uint32)):
            bad.append(f"{name}: dequantize(stored) differs from stored expected")
        print(f"{name:7} {t.tensor_type.name:7} shape {[int(n) for n in t.shape]} {raw.nbytes:5} B  "
              f"expected range [{exp.min():.4g}, {exp.max():.4g}]")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the file on disk, write nothing")
    args = ap.parse_args()
    blocks = build()
    if not args.check:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        write(OUT, blocks)
    bad = check(OUT, blocks)
    print(f"{OUT.relative_to(ROOT)}: {OUT.stat().st_size} bytes, gguf {version()}")
    if bad:
        sys.exit("\n".join(bad))


if __name__ == "__main__":
    main()
