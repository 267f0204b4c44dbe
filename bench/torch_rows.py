#!/usr/bin/env python3
# kiln — header-only C++20 tensor compiler.
# SPDX-License-Identifier: Apache-2.0
"""PyTorch eager and torch.compile on gpu_bench's rows that torch_anchor.py does not have
(softmax over rows too long to keep in registers; a bf16 weight and bias along rows; W4's bias
gradients' column sums), timed as gpu_bench times kiln: CUDA events, L2 flushed before each
call, median of 20 after 3 warm-ups. Writes JSON lines
{"type": "workload", "workload", "modes": {"eager": {"ms"}, "default": {"ms"}}} to argv[1]
(if given); compare_torch.py sets them beside kiln's.

usage: torch_rows.py [out.jsonl]
"""

import torch

from torch_gemm import time_ms, write_jsonl  # the same timing and output (bench/ is on the path when run as a script)


def row(name, workload, f, args):
    """eager and torch.compile of f(*args), each checked against f in float64, then timed"""
    cf = torch.compile(f)
    ref = f(*(a.double() for a in args))
    modes = {}
    for mode, fn in (("eager", f), ("default", cf)):
        err = ((fn(*args).double() - ref).abs().max() / ref.abs().max()).item()
        modes[mode] = {"ms": time_ms(lambda: fn(*args)), "rel_vs_fp64": err}
        print(f"torch {name} {mode:8s} {modes[mode]['ms']:.4f} ms  rel.err {err:.1e}", flush=True)
    return {"type": "workload", "workload": workload, "modes": modes}


def main():
    x = torch.randn(2048, 65536, device="cuda")
    out = [row("softmax [2048,65536]", "softmax_long", lambda t: torch.softmax(t, -1), (x,))]
    xb = torch.randn(16384, 4096, device="cuda").bfloat16()
    w, b = torch.randn(4096, device="cuda").bfloat16(), torch.randn(4096, device="cuda").bfloat16()
    out.append(row("x*w+b bf16 [16384,4096]", "bias_rows", lambda t, u, v: t * u + v, (xb, w, b)))
    for c in (16384, 4096):  # W4's bias gradients: column sums
        out.append(row(f"sum(x, 0) bf16 [8192,{c}]", f"colsum_{c}", lambda t: t.sum(0),
                       (torch.randn(8192, c, device="cuda").bfloat16(),)))
    write_jsonl(out)


if __name__ == "__main__":
    main()
