#!/usr/bin/env python3
# kiln — header-only C++20 tensor compiler.
# SPDX-License-Identifier: Apache-2.0
"""Sets kiln's GPU bench (gpu_bench's JSON lines) beside torch_anchor.py's results
from the same machine and run: kiln compiled vs kiln eager, vs PyTorch eager and
torch.compile, and achieved GB/s against the copy ceiling measured by kiln; for the
W4 training step (torch_anchor.py group G3), TFLOP/s and the error against float64
of kiln and of torch.compile.

usage: compare_torch.py kiln.jsonl [torch/results.jsonl] [torch_gemm.jsonl] [torch_rows.jsonl]
"""
import json
import sys

NAMES = {"W1 gelu chain f32": "W1", "W2 softmax f32": "W2", "W3 layer_norm bf16": "W3",
         "W8 sum f32": "W8a", "W8 var_mean f32": "W8b", "W8 sum+var_mean f32": "W8c", "W7 small MLP f32": "W7",
         "W4 MLP step bf16": "W4", "softmax f32 [2048,65536] long rows": "softmax_long",
         "x*w+b bf16 [16384,4096]": "bias_rows", "sum(x, 0) bf16 [8192,16384]": "colsum_16384",
         "sum(x, 0) bf16 [8192,4096]": "colsum_4096"}


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    kiln = load(sys.argv[1])
    torch = [r for path in sys.argv[2:] for r in load(path)]
    ceil = next((r for r in kiln if r["type"] == "ceiling"), None)
    if ceil is None:  # a GEMM-only run (KILN_BENCH_ONLY=gemm)
        return gemm_table(kiln, torch)
    tw = {}  # by workload; the modes of every file that has it (e.g. W7's reduce-overhead run apart)
    for r in torch:
        if r.get("type") == "workload":
            w = tw.setdefault(r["workload"], {**r, "modes": {}})
            w["modes"].update(r.get("modes", {}))
    host = (f"; launch floor {ceil['launch_floor_us']:.2f} us; compiled x+1 {ceil['compiled_plus_one_us']:.2f} us/call"
            + (f" (reduce-overhead: {ceil['reduce_overhead_plus_one_us']:.2f})" if "reduce_overhead_plus_one_us" in ceil else "")
            if "launch_floor_us" in ceil else "")  # absent from a KILN_BENCH_ONLY=rows run
    print(f"copy ceiling (kiln, same run): {ceil['copy_gbs']:.0f} GB/s{host}")
    print("| workload | kiln fused ms | kiln eager ms | torch eager ms | torch.compile ms | kiln GB/s | % of copy | "
          "vs kiln eager | vs torch eager | vs torch.compile |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    notes = []
    for r in kiln:
        if r["type"] != "kiln":
            continue
        t = tw.get(NAMES.get(r["name"], ""), {}).get("modes", {})
        te, tc = t.get("eager", {}).get("ms"), t.get("default", {}).get("ms")
        if "fused_us" in r:  # latency row: microseconds per call, wall clock
            f, e = r["fused_us"] / 1e3, r["eager_us"] / 1e3
            gbs = pct = "-"
            if "reduce_overhead_us" in r:  # kiln's graphs beside torch.compile's (mode="reduce-overhead")
                ro, tro = r["reduce_overhead_us"], t.get("reduce-overhead", {}).get("ms")
                notes.append(f"{r['name']} in reduce-overhead mode: kiln {ro:.1f} us/call ({r['reduce_overhead_calls']} replays, "
                             f"{r['graphs_built']} graphs built, {r['graph_updates']} node updates)"
                             + (f", torch.compile reduce-overhead {tro * 1e3:.1f} us/call: {tro * 1e3 / ro:.2f}x" if isinstance(tro, (int, float)) else "")
                             + f"; kiln fused {r['fused_us']:.1f} us/call: {r['fused_us'] / ro:.2f}x")
        elif "flops" in r:  # matmul-bound: TFLOP/s in the GB/s column, against torch's bf16 matmul ceiling
            # The step as torch_anchor.py times it, where the bench measured that (anchor_ms); the
            # median of its rounds is in the notes.
            f, e = r.get("fused_anchor_ms", r["fused_ms"]), r["eager_ms"]
            g = r["flops"] / f / 1e9
            tceil = next((x.get("bf16_matmul_TFLOPs") for x in torch if x.get("type") == "ceilings"), None)
            gbs, pct = f"{g:.0f} TFLOP/s", (f"{100 * g / tceil:.1f}% of bf16 mm" if tceil else "-")
            tfp = t.get("default", {}).get("rel_vs_fp64")
            notes.append(f"{r['name']}: max rel. error vs float64 (loss and gradients): kiln {r['rel_err']:.1e}"
                         + (f", torch.compile {tfp:.1e}" if isinstance(tfp, float) else "")
                         + "; per output: " + ", ".join(f"{k} {v:.1e}" for k, v in r.get("rel_err_grads", {}).items())
                         + f", loss {r.get('rel_err_loss', float('nan')):.1e}")
            if "fused_min_ms" in r and isinstance(tc, (int, float)):  # torch's figure is the smaller of its two medians
                notes.append(f"{r['name']}: " + (f"kiln timed as torch_anchor.py times (gpu_bench's anchor_ms) {f:.3f} ms, "
                                                 f"torch.compile {tc:.3f} ms: {tc / f:.2f}x; " if "fused_anchor_ms" in r else "")
                             + f"median of kiln's rounds {r['fused_ms']:.3f} ms: {tc / r['fused_ms']:.2f}x; the smallest of them "
                             f"{r['fused_min_ms']:.3f} ms: {tc / r['fused_min_ms']:.2f}x"
                             + (f"; back to back (no L2 flush): kiln {r['fused_loop_ms']:.3f} ms, torch.compile "
                                f"{t['default']['loop_ms']:.3f} ms: {t['default']['loop_ms'] / r['fused_loop_ms']:.2f}x"
                                if "loop_ms" in t.get("default", {}) and "fused_loop_ms" in r else ""))
        else:
            f, e = r["fused_ms"], r["eager_ms"]
            g = r["bytes"] / f / 1e6
            gbs, pct = f"{g:.0f}", f"{100 * g / ceil['copy_gbs']:.1f}%"
        fmt = lambda x: f"{x:.4f}" if isinstance(x, (int, float)) else "-"
        ratio = lambda x: f"{x / f:.2f}x" if isinstance(x, (int, float)) else "-"
        print(f"| {r['name']} | {fmt(f)} | {fmt(e)} | {fmt(te)} | {fmt(tc)} | {gbs} | {pct} | {ratio(e)} | {ratio(te)} | {ratio(tc)} |")
    for n in notes:
        print("- " + n)
    gemm_table(kiln, torch)


def gemm_table(kiln, torch):
    """GEMM rows of gpu_bench beside torch_gemm.py's (torch.matmul, cuBLAS) from the same run."""
    tg = {r["name"]: r for r in torch if r.get("type") == "torch_gemm"}
    rows = [r for r in kiln if r.get("type") == "gemm"]
    if not rows:
        return
    # torch.compile's time where torch_gemm.py has one (the prologue rows)
    print("| GEMM | kiln config | kiln ms | kiln TFLOP/s | torch ms | torch TFLOP/s | kiln / torch | torch.compile ms | kiln / torch.compile | rel. err |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        t, c = tg.get(r["name"]), tg.get(r["name"] + " (torch.compile)")
        tms, ttf = (f"{t['ms']:.3f}", f"{t['tflops']:.1f}") if t else ("-", "-")
        ratio = f"{100 * r['tflops'] / t['tflops']:.1f}%" if t else "-"
        cms, cratio = (f"{c['ms']:.3f}", f"{100 * r['tflops'] / c['tflops']:.1f}%") if c else ("-", "-")
        print(f"| {r['name']} | {r['config']} | {r['ms']:.3f} | {r['tflops']:.1f} | {tms} | {ttf} | {ratio} | {cms} | {cratio} | {r['rel_err']:.1e} |")


if __name__ == "__main__":
    main()
