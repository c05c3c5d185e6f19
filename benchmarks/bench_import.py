"""Import-time cost of torch_overlay: `import torch` with and without the overlay, and the first
import of torch.distributed.tensor (where a DTensor patch is applied) with and without it.

Each figure is the median of N fresh interpreters (-X importtime is not used: it distorts).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TIMER = """
import time
t0 = time.perf_counter()
{pre}
import torch
t1 = time.perf_counter()
import torch.distributed.tensor
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def _measure(pre: str, runs: int, overlay: str) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_OVERLAY": overlay}
    torch_times, dtensor_times = [], []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", TIMER.format(pre=pre)], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        torch_times.append(float(out[0]))
        dtensor_times.append(float(out[1]))
    return statistics.median(torch_times), statistics.median(dtensor_times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    _measure("", 1, "1")  # warm the file system cache
    # Interleave the variants so that machine noise hits both alike.
    base_t, base_d, over_t, over_d = [], [], [], []
    for _ in range(args.runs):
        t, d = _measure("", 1, "1")
        base_t.append(t)
        base_d.append(d)
        t, d = _measure("import torch_overlay", 1, "1")
        over_t.append(t)
        over_d.append(d)
    bt, bd = statistics.median(base_t), statistics.median(base_d)
    ot, od = statistics.median(over_t), statistics.median(over_d)
    print(f"import torch:                    {bt * 1e3:7.1f} ms alone, {ot * 1e3:7.1f} ms with torch_overlay (ratio {ot / bt:.3f}, goal <= 1.05)")
    print(f"first import of DTensor package: {bd * 1e3:7.1f} ms alone, {od * 1e3:7.1f} ms with torch_overlay (ratio {od / bd:.3f})")


if __name__ == "__main__":
    main()
