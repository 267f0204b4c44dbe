#!/usr/bin/env python3
# kiln — header-only C++20 tensor compiler.
# SPDX-License-Identifier: Apache-2.0
"""PyTorch eager and torch.compile on gpu_bench's rows that torch_anchor.py does not have
(softmax over rows too long to keep in registers), timed as gpu_bench times kiln: CUDA
events, L2 flushed before each call, median of 20 after 3 warm-ups. Writes JSON lines
{"type": "workload", "workload", "modes": {"eager": {"ms"}, "default": {"ms"}}} to argv[1]
(if given); compare_torch.py sets them beside kiln's.

usage: torch_rows.py [out.jsonl]
"""

import torch

from torch_gemm import time_ms, write_jsonl  # the same timing and output (bench/ is on the path when run as a script)


def main():
    x = torch.randn(2048, 65536, device="cuda")
    f = lambda t: torch.softmax(t, -1)
    cf = torch.compile(f)
    ref = f(x.double())
    modes = {}
    for mode, fn in (("eager", f), ("default", cf)):
        err = ((fn(x).double() - ref).abs().max() / ref.abs().max()).item()
        modes[mode] = {"ms": time_ms(lambda: fn(x)), "rel_vs_fp64": err}
        print(f"torch softmax [2048,65536] {mode:8s} {modes[mode]['ms']:.4f} ms  rel.err {err:.1e}", flush=True)
    write_jsonl([{"type": "workload", "workload": "softmax_long", "modes": modes}])


if __name__ == "__main__":
    main()
