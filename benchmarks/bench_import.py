"""Import-time cost of torch_overlay.

0. Instructions (callgrind, when valgrind is installed): ``import torch`` alone vs
   ``import torch_overlay, torch``, warm code cache, the package's bytecode compiled first as an
   install does (goal: ratio <= 1.02). Deterministic, whatever else the machine runs.
1. Wall time: ``import torch`` alone vs ``import torch_overlay`` + ``import torch``.
2. The first import of each group of patched modules (through the entry point a trainer imports:
   DTensor, AOTAutograd, inductor) with and without the overlay, with a warm code cache
   (goal: ratio <= 1.10) and a cold one (reported).

Each figure is the median over fresh interpreters, the variants interleaved so that machine noise
hits them alike (-X importtime is not used: it distorts). Run it on an idle machine.
``--smoke`` runs each variant once, without callgrind and the cold caches: that the benchmark
runs, in seconds, not what it measures.
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENTRY_POINTS = ("torch.distributed.tensor", "torch._functorch.aot_autograd", "torch._inductor.compile_fx")

TIMER = """
import time
t0 = time.perf_counter()
{pre}
import torch
t1 = time.perf_counter()
{entry}
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def _run(pre: str, entry: str, cache: str, overlay: str = "1") -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_OVERLAY": overlay, "TORCH_OVERLAY_CACHE_DIR": cache}
    code = TIMER.format(pre=pre, entry=f"import {entry}" if entry else "")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    first, second = out.stdout.split()
    return float(first), float(second)


def _instructions(code: str, cache: str, seed: int) -> int:
    """Instructions callgrind counts for ``python -c code`` (the whole process)."""
    # Deterministic counts need a fixed hash seed (string hashing steers dict and set work: about
    # +-1% of `import torch` between seeds) and one BLAS/OpenMP thread (OpenBLAS's idle workers
    # spin, and callgrind counts their instructions too).
    fixed = {"PYTHONHASHSEED": str(seed), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_OVERLAY_CACHE_DIR": cache, **fixed}
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", code],
        env=env, capture_output=True, text=True, check=True,
    )
    return int(re.search(r"Collected : (\d+)", out.stderr).group(1))


SEEDS = (0, 1, 2)


def instructions(cache: str) -> None:
    # As installed: pip compiles the package's bytecode; here PYTHONDONTWRITEBYTECODE may be set.
    compileall.compile_dir(str(REPO / "torch_overlay"), quiet=1)
    _run("import torch_overlay", "", cache)  # a warm code cache
    ratios, bases = [], []
    for seed in SEEDS:
        base = _instructions("import torch", cache, seed)
        over = _instructions("import torch_overlay, torch", cache, seed)
        ratios.append(over / base)
        bases.append(base)
        print(
            f"PYTHONHASHSEED={seed}: import torch {base / 1e9:.3f} G instructions alone, "
            f"{over / 1e9:.3f} G with torch_overlay (ratio {over / base:.4f})"
        )
    with tempfile.TemporaryDirectory(prefix="torch_overlay_cold_") as cold_dir:
        cold = _instructions("import torch_overlay, torch", cold_dir, SEEDS[0])
    print(
        f"import cost (callgrind, bytecode compiled, warm code cache): ratio {max(ratios):.4f} at most "
        f"over {len(SEEDS)} hash seeds (goal <= 1.02); cold code cache, seed {SEEDS[0]}: "
        f"{cold / 1e9:.3f} G (ratio {cold / bases[0]:.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=11, help="fresh interpreters per variant for import torch")
    parser.add_argument("--module-runs", type=int, default=5, help="per variant and entry point")
    parser.add_argument("--instructions-only", action="store_true", help="the callgrind counts alone")
    parser.add_argument("--smoke", action="store_true", help="once each, no callgrind, no cold cache (seconds)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="torch_overlay_bench_") as warm:
        if args.smoke:
            smoke(warm)
        else:
            measure(args, warm)


def smoke(warm: str) -> None:
    alone = _run("", "", warm)[0]
    over = _run("import torch_overlay", ENTRY_POINTS[0], warm)[0]
    print(f"import torch (smoke, one run each): {alone * 1e3:.1f} ms alone, {over * 1e3:.1f} ms with torch_overlay")


def measure(args: argparse.Namespace, warm: str) -> None:
    if shutil.which("valgrind"):
        instructions(warm)
    else:
        print("valgrind not found: no instruction counts (apt-get install valgrind)")
    if args.instructions_only:
        return
    for entry in ENTRY_POINTS:
        _run("import torch_overlay", entry, warm)  # fill the code cache and the OS file cache

    base, over = [], []
    for _ in range(args.runs):
        base.append(_run("", "", warm)[0])
        over.append(_run("import torch_overlay", "", warm)[0])
    b, o = statistics.median(base), statistics.median(over)
    print(f"import torch: {b * 1e3:7.1f} ms alone, {o * 1e3:7.1f} ms with torch_overlay (ratio {o / b:.3f}; wall time, noisy)")

    for entry in ENTRY_POINTS:
        alone, warm_t, cold_t = [], [], []
        for _ in range(args.module_runs):
            alone.append(_run("import torch_overlay", entry, warm, overlay="0")[1])
            warm_t.append(_run("import torch_overlay", entry, warm)[1])
            with tempfile.TemporaryDirectory(prefix="torch_overlay_cold_") as cold:
                cold_t.append(_run("import torch_overlay", entry, cold)[1])
        a, w, c = (statistics.median(x) for x in (alone, warm_t, cold_t))
        print(
            f"first import of {entry:<30} {a * 1e3:7.1f} ms without, {w * 1e3:7.1f} ms with "
            f"(warm cache, ratio {w / a:.3f}, goal <= 1.10), {c * 1e3:7.1f} ms cold (ratio {c / a:.3f})"
        )


if __name__ == "__main__":
    main()
