#!/usr/bin/env python3
# kiln — header-only C++20 tensor compiler.
# SPDX-License-Identifier: Apache-2.0
"""torch.matmul (cuBLAS) on the GEMM rows of gpu_bench (bf16 8192^3, the W4 GEMMs with
their transposed operands read in place, f32 4096^3, and f32 in TF32), timed as gpu_bench times kiln:
CUDA events, L2 flushed before each call, median of 20 after 3 warm-ups, random inputs.
Writes JSON lines {"type": "torch_gemm", "name", "ms", "tflops"} to argv[1] (if given);
compare_torch.py sets them beside kiln's.

usage: torch_gemm.py [out.jsonl]
"""
import json
import sys

import torch


def time_ms(fn, reps=20):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


def write_jsonl(records):
    """The records as JSON lines to argv[1], if given."""
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")


def main():
    torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's default: fp32 matmul is not TF32
    r = lambda m, n, dt=torch.bfloat16: torch.randn(m, n, device="cuda").to(dt)
    x, W1, h, W2, dy = r(8192, 4096), r(4096, 16384), r(8192, 16384), r(16384, 4096), r(8192, 4096)
    a, b = r(8192, 8192), r(8192, 8192)
    fa, fb = r(4096, 4096, torch.float32), r(4096, 4096, torch.float32)
    rows = [("bf16 8192^3", a, b), ("W4 x@W1 [8192,4096]x[4096,16384]", x, W1), ("W4 h@W2 [8192,16384]x[16384,4096]", h, W2),
            ("W4 dy@W2.t()", dy, W2.t()), ("W4 h.t()@dy", h.t(), dy), ("W4 dh@W1.t()", h, W1.t()), ("W4 x.t()@dh", x.t(), h),
            ("f32 4096^3", fa, fb)]
    # TF32 allowed, as kiln's rows with kiln::set_allow_tf32(true)
    fbt, fa8, fb8 = r(4096, 4096, torch.float32), r(8192, 8192, torch.float32), r(8192, 8192, torch.float32)
    tf32 = [("f32 4096^3 TF32", fa, fb), ("f32 4096^3 TF32 a@b.t()", fa, fbt.t()), ("f32 8192^3 TF32", fa8, fb8)]
    # gpu_bench's small f32 GEMMs (fewer tiles than SMs)
    for m, n, k in ((32, 256, 256), (256, 512, 512), (512, 512, 2048), (128, 1024, 4096), (1024, 1024, 1024)):
        rows.append((f"f32 small [{m},{k}]x[{k},{n}]", r(m, k, torch.float32), r(k, n, torch.float32)))
    out = []
    for name, p, q in rows + tf32:
        torch.backends.cuda.matmul.allow_tf32 = "TF32" in name
        ms = time_ms(lambda: torch.matmul(p, q))
        tf = 2.0 * p.shape[0] * p.shape[1] * q.shape[1] / ms / 1e9
        print(f"torch GEMM {name:34s} {ms:8.3f} ms  {tf:6.1f} TFLOP/s", flush=True)
        out.append({"type": "torch_gemm", "name": name, "ms": ms, "tflops": tf})
    # gpu_bench's prologue rows: the operand computed from another tensor, eager and torch.compile'd
    torch.backends.cuda.matmul.allow_tf32 = False
    x32, w16 = r(8192, 4096, torch.float32), r(4096, 4096)
    fa2, fb2 = r(4096, 4096, torch.float32), r(4096, 4096, torch.float32)
    fa3, fb3 = r(256, 512, torch.float32), r(512, 512, torch.float32)
    pro = [("prologue cast<bf16>(x f32) @ W bf16", lambda p, q: p.to(torch.bfloat16) @ q, x32, w16),
           ("prologue (x * 0.5) @ W f32 4096^3", lambda p, q: (p * 0.5) @ q, fa2, fb2),
           ("prologue (x * 0.5) @ W f32 [256,512]x[512,512]", lambda p, q: (p * 0.5) @ q, fa3, fb3)]
    for name, fn, p, q in pro:
        for label, f in (("eager", fn), ("torch.compile", torch.compile(fn))):
            ms = time_ms(lambda: f(p, q))
            tf = 2.0 * p.shape[0] * p.shape[1] * q.shape[1] / ms / 1e9
            print(f"torch GEMM {name} ({label}) {ms:8.3f} ms  {tf:6.1f} TFLOP/s", flush=True)
            out.append({"type": "torch_gemm", "name": name if label == "eager" else name + " (torch.compile)", "ms": ms, "tflops": tf})
    write_jsonl(out)


if __name__ == "__main__":
    main()
