#!/usr/bin/env python3
# kiln — header-only C++20 tensor compiler.
# SPDX-License-Identifier: Apache-2.0
"""W4's six GEMMs through torch.matmul (cuBLAS), plain, back to back: 100 sequences between two
CUDA events, the smaller of two rounds, three rounds printed; as gpu_bench's "W4's six GEMMs"
(KILN_BENCH_EPILOGUE_AB=1 KILN_BENCH_ONLY=w4). What cuBLAS's GEMMs take at the clock the power
limit holds, beside kiln's: the step's GEMMs without its epilogues and sums.

usage: torch_w4_gemms.py
"""
import torch


def loop_ms(fn, n=100):
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(2):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            fn()
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e) / n)
    return best


def main():
    r = lambda m, n: torch.randn(m, n, device="cuda").to(torch.bfloat16)
    x, W1, W2, h, dy = r(8192, 4096), r(4096, 16384), r(16384, 4096), r(8192, 16384), r(8192, 4096)

    def six():
        return (x @ W1, h @ W2, dy @ W2.t(), h.t() @ dy, h @ W1.t(), x.t() @ h)

    for i in range(3):
        print(f"torch W4's six GEMMs, plain, round {i}: back to back {loop_ms(six):8.3f} ms", flush=True)


if __name__ == "__main__":
    main()
