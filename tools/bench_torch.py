#!/usr/bin/env python3
"""PyTorch baselines for the kernel benchmarks, on the same machine in the same run:
f32 GEMM (T=128 prefill) and f32 GEMV at the Gemma 3 1B shapes that
`cargo bench -p ktune-bench --bench kernels` uses, plus a read-bandwidth probe.

    python3 tools/bench_torch.py [--threads N]
Prints one line per case: GFLOP/s (GEMM) or GB/s (GEMV, bandwidth).
"""
import argparse
import time

import torch

SHAPES = [(6912, 1152), (1152, 6912), (1152, 1152)]  # (n, k): weight rows x cols
T = 128


def bench(fn, min_time=1.0):
    fn()
    fn()
    reps, start = 0, time.perf_counter()
    times = []
    while time.perf_counter() - start < min_time or reps < 5:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        reps += 1
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    big = torch.ones(128 << 20, dtype=torch.float32)  # 512 MiB
    t = bench(lambda: big.sum())
    print(f"membw read 512MiB: {big.numel() * 4 / t / 1e9:.1f} GB/s")
    for n, k in SHAPES:
        w = torch.randn(n, k)
        x = torch.randn(T, k)
        t = bench(lambda: torch.nn.functional.linear(x, w))
        print(f"gemm f32 m{T}_{n}x{k}: {2 * T * n * k / t / 1e9:.1f} GFLOP/s ({t * 1e3:.3f} ms)")
    for n, k in SHAPES:
        w = torch.randn(n, k)
        x = torch.randn(k)
        t = bench(lambda: torch.mv(w, x))
        print(f"gemv f32 {n}x{k}: {(n * k + n + k) * 4 / t / 1e9:.1f} GB/s ({t * 1e6:.1f} us)")


if __name__ == "__main__":
    main()
