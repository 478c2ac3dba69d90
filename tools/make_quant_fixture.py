#!/usr/bin/env python3
"""Writes tests/fixtures/quant/: f32 inputs and their ggml block streams as
quantized by the `gguf` Python package (`gguf.quants.quantize`, llama.cpp's
reference quantizers), for Q8_0, Q4_0 and Q4_1. tests/quant_gguf.rs checks that
`QMatrix::quantize` produces the same bytes.

Run with the repo's tools venv (in the ignored target/; tools/requirements.txt
pins gguf and numpy):

    python3 -m venv target/venv-py && target/venv-py/bin/pip install -r tools/requirements.txt
    target/venv-py/bin/python tools/make_quant_fixture.py
"""
import json
from pathlib import Path

import numpy as np
import gguf
from gguf import quants

ROWS, COLS = 12, 256
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "quant"


def inputs() -> np.ndarray:
    rng = np.random.default_rng(20261123)
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32) * 0.05
    x[1] *= 40.0  # large magnitudes
    x[2, :32] = 0.0  # an all-zero block (d = 0)
    x[2, 32:64] = 0.25  # a constant block (Q4_1: max == min)
    x[3, :32] = -np.abs(x[3, :32])  # negative-only block
    x[3, 32:64] = np.abs(x[3, 32:64])  # positive-only block
    # Exact half steps: values on the rounding boundaries of every format.
    x[4, :32] = (np.arange(32, dtype=np.float32) - 15.5) / 15.5
    x[4, 32:64] = np.linspace(-1.0, 1.0, 32, dtype=np.float32)
    x[5, :32] = np.float32(1e-8) * rng.standard_normal(32).astype(np.float32)  # tiny (f16 subnormal scales)
    x[6, 0] = 100.0  # one outlier per block
    x[6, 40] = -100.0
    return x


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    x = inputs()
    (OUT / "input.f32").write_bytes(x.astype("<f4").tobytes())
    meta = {"rows": ROWS, "cols": COLS, "gguf_version": getattr(gguf, "__version__", "unknown"), "formats": {}}
    for name, t in [("q8_0", gguf.GGMLQuantizationType.Q8_0), ("q4_0", gguf.GGMLQuantizationType.Q4_0), ("q4_1", gguf.GGMLQuantizationType.Q4_1)]:
        q = quants.quantize(x, t)
        raw = np.ascontiguousarray(q).tobytes()
        (OUT / f"{name}.bin").write_bytes(raw)
        meta["formats"][name] = {"file": f"{name}.bin", "bytes": len(raw)}
    (OUT / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
