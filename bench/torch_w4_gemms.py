#!/usr/bin/env python3
# kiln — header-only C++20 tensor compiler.
# SPDX-License-Identifier: Apache-2.0
"""W4's six GEMMs through torch.matmul (cuBLAS), plain, back to back: 100 sequences between two
CUDA events, the smaller of two rounds, three rounds printed; as gpu_bench's "W4's six GEMMs"
(KILN_BENCH_EPILOGUE_AB=1 KILN_BENCH_ONLY=w4). What cuBLAS's GEMMs take at the clock the power
limit holds, beside kiln's: the step's GEMMs without its epilogues and sums.

With --energy, each GEMM, the W4 step (eager and torch.compile) and the six in a row, each back
to back for about a second after half a second's warm-up, the board's energy counter (NVML) read
on either side: time, energy and mean power per call, and the SM clock the power limit holds; as
gpu_bench's KILN_BENCH_ONLY=energy. --quick leaves the GEMMs one by one out.

usage: torch_w4_gemms.py [--energy [--quick]]
"""
import ctypes
import sys
import time

import torch


class Nvml:
    """The board's energy counter (mJ) and SM clock, from libnvidia-ml through ctypes."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        assert self.lib.nvmlInit_v2() == 0
        self.dev = ctypes.c_void_p()
        assert self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.dev)) == 0

    def joules(self):
        mj = ctypes.c_ulonglong()
        assert self.lib.nvmlDeviceGetTotalEnergyConsumption(self.dev, ctypes.byref(mj)) == 0
        return mj.value / 1000.0

    def sm_mhz(self):
        m = ctypes.c_uint()
        return m.value if self.lib.nvmlDeviceGetClockInfo(self.dev, 1, ctypes.byref(m)) == 0 else 0


def energy_loop(nv, fn, warm=0.5, secs=1.0):
    t0, calls = time.perf_counter(), 0
    while time.perf_counter() - t0 < warm:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        calls += 10
    n = max(20, int(secs / ((time.perf_counter() - t0) / calls)))
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    j0 = nv.joules()
    s.record()
    for _ in range(n):
        fn()
    e.record()
    mhz = nv.sm_mhz()
    e.synchronize()
    j1, ms = nv.joules(), s.elapsed_time(e)
    return ms / n, (j1 - j0) * 1000.0 / n, (j1 - j0) / (ms / 1000.0), mhz


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

    gemms = [("x @ W1", lambda: x @ W1), ("h @ W2", lambda: h @ W2), ("dy @ W2.t()", lambda: dy @ W2.t()),
             ("h.t() @ dy", lambda: h.t() @ dy), ("h @ W1.t()", lambda: h @ W1.t()), ("x.t() @ h", lambda: x.t() @ h)]

    def six():
        return tuple(fn() for _, fn in gemms)

    if "--energy" in sys.argv:
        nv, flops = Nvml(), 2.0 * 8192 * 4096 * 16384
        for rnd in range(0 if "--quick" in sys.argv else 2):  # --quick: the step and the six in a row alone
            for name, fn in gemms:
                ms, mj, w, mhz = energy_loop(nv, fn)
                print(f"torch energy, round {rnd}, {name:<12} cuBLAS {ms:7.3f} ms {mj:7.1f} mJ {w:5.0f} W {mhz:4d} MHz "
                      f"{flops / ms / 1e9:5.0f} TFLOP/s {mj * 1e9 / flops:5.2f} pJ/flop", flush=True)
        # The W4 step itself (torch_anchor.py's MLP), eager and torch.compile's default mode.
        F, g = torch.nn.functional, torch.Generator(device="cuda").manual_seed(40)
        rp = lambda *s, scale: (torch.randn(*s, device="cuda", generator=g) * scale).to(torch.bfloat16).requires_grad_()
        P = [rp(4096, 16384, scale=4096 ** -0.5), rp(16384, scale=0.02), rp(16384, 4096, scale=16384 ** -0.5), rp(4096, scale=0.02)]
        xs = rp(8192, 4096, scale=1.0)

        def fwd(x, W1, b1, W2, b2):
            y = F.gelu(x @ W1 + b1) @ W2 + b2
            return (y.float() ** 2).mean()

        for label, f in (("eager", fwd), ("torch.compile", torch.compile(fwd))):
            step = lambda: torch.autograd.grad(f(xs, *P), [xs] + P)
            for rnd in range(2):
                ms, mj, w, mhz = energy_loop(nv, step)
                print(f"torch energy, round {rnd}, W4 step, {label:<13}: {ms:7.3f} ms {mj:7.1f} mJ {w:5.0f} W {mhz:4d} MHz "
                      f"{mj * 1e9 / (6 * flops):5.2f} pJ/flop", flush=True)
        for rnd in range(2):
            ms, mj, w, mhz = energy_loop(nv, six)
            print(f"torch energy, round {rnd}, the six back to back, cuBLAS: {ms:7.3f} ms {mj:7.1f} mJ {w:5.0f} W {mhz:4d} MHz "
                  f"{mj * 1e9 / (6 * flops):5.2f} pJ/flop", flush=True)
        return
    for i in range(3):
        print(f"torch W4's six GEMMs, plain, round {i}: back to back {loop_ms(six):8.3f} ms", flush=True)


if __name__ == "__main__":
    main()
