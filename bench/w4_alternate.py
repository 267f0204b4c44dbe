#!/usr/bin/env python3
# kiln — header-only C++20 tensor compiler.
# SPDX-License-Identifier: Apache-2.0
"""The W4 training step, kiln against torch.compile, from processes run alternately
(scripts/gpu-check's part w4-ab: kiln, torch, kiln, torch, ...). The step is bound by
the GPU's power limit and its time drifts as the GPU warms, so a comparison from one
kiln run followed by one torch run favours whichever ran on the cooler GPU; here each
side's figures come from every round, and every pair is printed. kiln's process times the step as
torch_anchor.py does, then back to back, first thing after its compile, as torch_anchor.py's
process does (bench/gpu_bench.cpp, w4_step_bench), and scripts/gpu-check lets the board cool
before each process. Where the processes sampled it, a second table gives the SM clock each
step ran at under each protocol (kiln's row's anchor_mhz and loop_mhz; torch's "[clock]" lines).

usage: w4_alternate.py [--mode MODE] kiln-1.jsonl torch-1/results.jsonl [kiln-2.jsonl torch-2/results.jsonl ...]
MODE is torch.compile's mode the torch runs timed (default "default"; the matmul issue's goal
is against "max-autotune").
"""
import json
import os
import re
import statistics
import sys


def last(path, pred):
    """The file's last record that pred takes: torch_anchor.py appends to a results.jsonl that is
    already there (a directory left by an earlier call on the same machine)."""
    try:
        with open(path) as f:
            return next((r for r in reversed([json.loads(l) for l in f if l.strip()]) if pred(r)), None)
    except OSError:
        return None


def torch_clocks(results_path):
    """torch.compile's SM clocks (MHz) as torch_anchor.py timed its step queued after flushes and back
    to back, from the "[clock]" lines bench/torch_anchor_clocks.py printed to the log beside its
    output directory (scripts/gpu-check: w4-torch-R.log beside w4-torch-R/results.jsonl); None where missing."""
    log, found = os.path.dirname(os.path.abspath(results_path)) + ".log", {}
    try:
        with open(log) as f:
            for line in f:
                if m := re.match(r"\[clock\] (anchor|back to back)\b.*: (\d+) MHz", line):
                    found[m[1]] = int(m[2])  # the last: the step's own timings come last
    except OSError:
        pass
    return found.get("anchor"), found.get("back to back")


def main():
    paths, mode = sys.argv[1:], "default"
    if paths[:1] == ["--mode"] and len(paths) > 1:
        mode, paths = paths[1], paths[2:]
    if not paths or len(paths) % 2:
        sys.exit(__doc__)
    tc_name = "torch.compile" + ("" if mode == "default" else f" ({mode})")
    # NOTE: "same timing" is the like-for-like ratio (torch_anchor.py's protocol, each process's first
    # timing); "ratio" sets kiln's median of three flushed rounds, timed later in its process on a
    # warmer board, against torch's smaller median.
    print("| round | kiln fused ms (median of 3 rounds) | kiln smallest round | kiln as torch_anchor times | kiln back to back "
          f"| {tc_name} ms (smaller of 2 medians) | {tc_name} back to back | ratio | ratio, same timing | ratio, back to back |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    kiln_all, torch_all, kiln_loop, torch_loop, kiln_same, torch_same = [], [], [], [], [], []
    clocks = []  # per pair: kiln and torch.compile's SM clocks, queued after flushes and back to back
    for i in range(0, len(paths), 2):
        k = last(paths[i], lambda r: r.get("type") == "kiln" and r.get("name") == "W4 MLP step bf16")
        t = last(paths[i + 1], lambda r: r.get("type") == "workload" and r.get("workload") == "W4")
        tc = (t or {}).get("modes", {}).get(mode, {})
        if k is None or "ms" not in tc:
            print(f"| {i // 2 + 1} | {'-' if k is None else k['fused_ms']} | | | | {tc.get('skipped', tc.get('error', '-'))} | | | | |")
            continue
        kiln_all.append(k["fused_ms"]), torch_all.append(tc["ms"])
        torch_anchor_mhz, torch_loop_mhz = torch_clocks(paths[i + 1])
        clocks.append((i // 2 + 1, k.get("anchor_mhz"), torch_anchor_mhz, k.get("loop_mhz"), torch_loop_mhz))
        kl, tl, ka = k.get("fused_loop_ms"), tc.get("loop_ms"), k.get("fused_anchor_ms")
        if kl and tl:
            kiln_loop.append(kl), torch_loop.append(tl)
        if ka:
            kiln_same.append(ka), torch_same.append(tc["ms"])
        num = lambda x: f"{x:.3f}" if x else "-"
        ratio = lambda a, b: f"{a / b:.3f}x" if a and b else "-"
        print(f"| {i // 2 + 1} | {k['fused_ms']:.3f} | {num(k.get('fused_min_ms'))} | {num(ka)} | {num(kl)} | "
              f"{tc['ms']:.3f} | {num(tl)} | {ratio(tc['ms'], k['fused_ms'])} | {ratio(tc['ms'], ka)} | {ratio(tl, kl)} |")
    if kiln_all:
        km, tm = statistics.median(kiln_all), statistics.median(torch_all)
        parts = []
        if kiln_same:
            ka, ta = statistics.median(kiln_same), statistics.median(torch_same)
            parts.append(f"both timed as torch_anchor.py times: kiln {ka:.3f} ms, {tc_name} {ta:.3f} ms: {ta / ka:.3f}x")
        if kiln_loop:
            kl, tl = statistics.median(kiln_loop), statistics.median(torch_loop)
            parts.append(f"back to back kiln {kl:.3f} ms, {tc_name} {tl:.3f} ms: {tl / kl:.3f}x")
        parts.append(f"kiln's median of three flushed rounds {km:.3f} ms against {tm:.3f} ms: {tm / km:.3f}x")
        print(f"W4 alternated, medians over {len(kiln_all)} pairs: " + "; ".join(parts))
    if any(any(c[1:]) for c in clocks):  # the SM clock the power limit held (gpu_bench's W4 row, torch_anchor_clocks.py)
        print("\n| round | kiln's SM clock as torch_anchor times (MHz) | torch.compile's | kiln's back to back | torch.compile's |")
        print("|---|--:|--:|--:|--:|")
        for c in clocks:
            print("| " + " | ".join(str(x or "-") for x in c) + " |")


if __name__ == "__main__":
    main()
