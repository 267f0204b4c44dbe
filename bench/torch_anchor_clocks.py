#!/usr/bin/env python3
# kiln — header-only C++20 tensor compiler.
# SPDX-License-Identifier: Apache-2.0
"""torch_anchor.py, unchanged, with the SM clock sampled while it times: its bench() (a flush
before each call, calls queued) and its loop_per_call() (back to back) each print
"[clock] NAME: M MHz (N samples)", the median of NVML's SM clock read every 2 ms on a thread of
its own, as gpu_bench's W4 row does for kiln's step (anchor_mhz, loop_mhz). So where the two
steps' times part between the two protocols (on the H200 kiln's step ran 1% longer queued after
flushes than back to back, torch.compile's 0.8% shorter: docs/benchmarks.md, forty-ninth
session), the clock the power limit held for each shows.

usage: KILN_TORCH_ANCHOR=path/to/torch_anchor.py torch_anchor_clocks.py [torch_anchor.py's arguments]
torch_anchor.py runs each batch of workloads in a child process of its own, started from its
__file__: that is this script here, so the child is clocked too. Without NVML it only runs
torch_anchor.py.
"""
import ctypes
import functools
import importlib.util
import os
import statistics
import sys
import threading
import time


class Nvml:
    """libnvidia-ml, loaded at run time as gpu_bench loads it; ok() is False where it is missing."""

    def __init__(self):
        self.dev = None
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
            dev = ctypes.c_void_p()
            if self.lib.nvmlInit_v2() == 0 and self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0:
                self.dev = dev
        except (OSError, AttributeError):
            pass

    def ok(self):
        return self.dev is not None

    def sm_mhz(self):
        mhz = ctypes.c_uint(0)
        return mhz.value if self.lib.nvmlDeviceGetClockInfo(self.dev, 1, ctypes.byref(mhz)) == 0 else 0  # NVML_CLOCK_SM


def clocked(fn, name, nvml):
    """fn, with the SM clock sampled from its start to its end and the median printed."""

    @functools.wraps(fn)
    def run(*args, **kw):
        samples, done = [], threading.Event()

        def sample():
            while not done.is_set():
                if m := nvml.sm_mhz():
                    samples.append(m)
                time.sleep(0.002)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        try:
            return fn(*args, **kw)
        finally:
            done.set()
            t.join()
            mhz = statistics.median(samples) if samples else 0
            print(f"[clock] {name}: {mhz:.0f} MHz ({len(samples)} samples)", flush=True)

    return run


def main():
    path = os.environ.get("KILN_TORCH_ANCHOR")
    if not path or not os.path.isfile(path):
        sys.exit("torch_anchor_clocks.py: set KILN_TORCH_ANCHOR to torch_anchor.py's path\n" + __doc__)
    spec = importlib.util.spec_from_file_location("torch_anchor", path)
    anchor = importlib.util.module_from_spec(spec)
    sys.modules["torch_anchor"] = anchor  # importable by name, as a module run as a script is
    spec.loader.exec_module(anchor)
    anchor.__file__ = os.path.abspath(__file__)  # the driver's children start here, clocked too
    nvml = Nvml()
    if nvml.ok():
        anchor.bench = clocked(anchor.bench, "anchor (torch_anchor.py's bench)", nvml)
        anchor.loop_per_call = clocked(anchor.loop_per_call, "back to back (its loop_per_call)", nvml)
    anchor.main()


if __name__ == "__main__":
    main()
