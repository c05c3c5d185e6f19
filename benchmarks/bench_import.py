"""Import-time cost of torch_overlay.

0. Instructions (callgrind, when valgrind is installed): ``import torch`` alone vs
   ``import torch_overlay, torch``, warm code cache, the package's bytecode compiled first as an
   install does (goal: ratio <= 1.01). Deterministic, whatever else the machine runs. Then the
   same with a series twice as long (the real one and as many generated patches against a module
   no job imports, in a copy of patches/): what a warm import reads must not grow with the
   series (goal: within 0.1% of the real series).
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
import difflib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
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


def _instructions(code: str, cache: str, seed: int, patches: Path | None = None) -> int:
    """Instructions callgrind counts for ``python -c code`` (the whole process)."""
    # Deterministic counts need a fixed hash seed (string hashing steers dict and set work: about
    # +-1% of `import torch` between seeds) and one BLAS/OpenMP thread (OpenBLAS's idle workers
    # spin, and callgrind counts their instructions too).
    fixed = {"PYTHONHASHSEED": str(seed), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_OVERLAY_CACHE_DIR": cache, **fixed}
    if patches is not None:
        env["TORCH_OVERLAY_PATCHES"] = str(patches)
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(re.search(r"Collected : (\d+)", out.stderr).group(1))


SEEDS = (0, 1, 2)


def _stdlib_of_torch() -> str:
    """``import a, b, ...`` of the standard-library modules a plain ``import torch`` imports."""
    probe = "import sys, torch; print(' '.join(sorted(sys.modules)))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    names = [m for m in out.stdout.split() if m.split(".")[0] in sys.stdlib_module_names and m != "__main__"]
    return "import " + ", ".join(names)


_BASES: dict[tuple[str, int], int] = {}


def _import_torch_alone(cache: str, seed: int) -> int:
    """``import torch`` alone (measured once per seed)."""
    if (cache, seed) not in _BASES:
        _BASES[(cache, seed)] = _instructions("import torch", cache, seed)
    return _BASES[(cache, seed)]


# A module that exists in every supported torch and that neither `import torch` nor a training job
# imports: the generated patches of the doubled series stay pending, as most real ones do.
UNUSED_MODULE = "torch/utils/show_pickle.py"


def doubled_series(folder: Path) -> tuple[Path, int]:
    """A copy of patches/ with one generated patch more per patch file (same messages, another
    id, a one-line diff against ``UNUSED_MODULE``); returns the folder and the number added."""
    patches = folder / "patches"
    shutil.copytree(REPO / "patches", patches)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    probe = "from torch_overlay.series.versions import torch_root; print(torch_root())"
    root = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    lines = (Path(root.stdout.strip()) / UNUSED_MODULE).read_text(encoding="utf-8").splitlines(True)
    names = []
    listed = [line.split("#", 1)[0].strip() for line in (patches / "series").read_text(encoding="utf-8").splitlines()]
    for n, real in enumerate(filter(None, listed), 1):
        message = (patches / real).read_text(encoding="utf-8").split("\ndiff --git ", 1)[0]
        # Pending on every torch (the fields that settle a patch without its files are dropped).
        message = re.sub(r"^(Introduced|Applied-Upstream|Torch-Versions):.*\n", "", message, flags=re.M)
        message = re.sub(r"^Overlay-Id: .*$", f"Overlay-Id: bench-generated-{n}", message, count=1, flags=re.M)
        new = lines[:3] + [f"# bench_import: generated patch {n}\n"] + lines[3:]
        diff = "".join(difflib.unified_diff(lines, new, f"a/{UNUSED_MODULE}", f"b/{UNUSED_MODULE}"))
        name = f"{9000 + n}-bench-generated-{n}.patch"
        (patches / name).write_text(f"{message}\ndiff --git a/{UNUSED_MODULE} b/{UNUSED_MODULE}\n{diff}-- \n2.39.5\n")
        names.append(name)
    with open(patches / "series", "a", encoding="utf-8") as f:
        f.write("".join(f"{name}\n" for name in names))
    # Files written just now are not indexed (a rewrite could keep their signature): date them back.
    past = time.time() - 60
    for file in patches.iterdir():
        os.utime(file, (past, past))
    return patches, len(names)


def instructions(cache: str, seeds: tuple[int, ...]) -> None:
    # As installed: pip compiles the package's bytecode; here PYTHONDONTWRITEBYTECODE may be set.
    compileall.compile_dir(str(REPO / "torch_overlay"), quiet=1)
    _run("import torch_overlay", "", cache)  # a warm code cache
    with tempfile.TemporaryDirectory(prefix="torch_overlay_doubled_") as scratch:
        doubled, added = doubled_series(Path(scratch))
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "TORCH_OVERLAY_CACHE_DIR": cache,
            "TORCH_OVERLAY_PATCHES": str(doubled),
        }
        subprocess.run([sys.executable, "-c", "import torch_overlay, torch"], env=env, check=True)  # its index
        ratios, doubled_ratios, bases = [], [], []
        # What the series itself costs, apart from torch's import: `import torch_overlay` after the
        # standard-library modules torch imports anyway (those are not the overlay's cost).
        preload = _stdlib_of_torch()
        alone = _instructions(preload, cache, seeds[0])
        own = _instructions(preload + "\nimport torch_overlay", cache, seeds[0]) - alone
        own_doubled = _instructions(preload + "\nimport torch_overlay", cache, seeds[0], doubled) - alone
        print(
            f"PYTHONHASHSEED={seeds[0]}: import torch_overlay itself (stdlib preloaded): {own / 1e6:.1f} M instructions, "
            f"{own_doubled / 1e6:.1f} M with the doubled series: {(own_doubled - own) / added / 1e3:.0f} k per patch file "
            f"({(own_doubled - own) / _import_torch_alone(cache, seeds[0]) * 100:+.3f}% of import torch for {added} files)"
        )
        for seed in seeds:
            base = _import_torch_alone(cache, seed)
            over = _instructions("import torch_overlay, torch", cache, seed)
            twice = _instructions("import torch_overlay, torch", cache, seed, doubled)
            ratios.append(over / base)
            doubled_ratios.append(twice / base)
            bases.append(base)
            print(
                f"PYTHONHASHSEED={seed}: import torch {base / 1e9:.4f} G instructions alone, "
                f"{over / 1e9:.4f} G with torch_overlay (ratio {over / base:.4f}), "
                f"{twice / 1e9:.4f} G with the doubled series (ratio {twice / base:.4f}, "
                f"{(twice / over - 1) * 100:+.3f}% over the real series)"
            )
    with tempfile.TemporaryDirectory(prefix="torch_overlay_cold_") as cold_dir:
        cold = _instructions("import torch_overlay, torch", cold_dir, seeds[0])
    growth = max((d / r - 1) * 100 for d, r in zip(doubled_ratios, ratios))
    print(
        f"import cost (callgrind, bytecode compiled, warm code cache): ratio {max(ratios):.4f} at most "
        f"over hash seed(s) {', '.join(map(str, seeds))} (goal <= 1.01); with the series doubled "
        f"({added} generated patch files more): {max(doubled_ratios):.4f}, {growth:+.3f}% (goal within 0.1%); "
        f"cold code cache, seed {seeds[0]}: {cold / 1e9:.3f} G (ratio {cold / bases[0]:.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=11, help="fresh interpreters per variant for import torch")
    parser.add_argument("--module-runs", type=int, default=5, help="per variant and entry point")
    parser.add_argument("--instructions-only", action="store_true", help="the callgrind counts alone")
    parser.add_argument("--instructions", action="store_true", help="the same as --instructions-only")
    parser.add_argument(
        "--seeds", default=",".join(map(str, SEEDS)), help="PYTHONHASHSEED values for callgrind (default: 0,1,2)"
    )
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
    # The doubled series of --instructions: every generated patch is pending, none failed.
    with tempfile.TemporaryDirectory(prefix="torch_overlay_doubled_") as scratch:
        doubled, added = doubled_series(Path(scratch))
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "TORCH_OVERLAY_CACHE_DIR": warm,
            "TORCH_OVERLAY_PATCHES": str(doubled),
        }
        code = (
            "import torch_overlay, torch\n"
            "rows = [r for r in torch_overlay.status() if r.id.startswith('bench-generated-')]\n"
            "print(len(rows), sum(r.state == 'pending' for r in rows))"
        )
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        found, pending = map(int, out.stdout.split()[-2:])
        if found != added or pending != added:
            raise SystemExit(f"doubled series: {added} patches generated, {found} read, {pending} pending")
        print(f"doubled series (smoke): {added} generated patches, all pending")


def measure(args: argparse.Namespace, warm: str) -> None:
    if shutil.which("valgrind"):
        instructions(warm, tuple(int(s) for s in args.seeds.split(",")))
    else:
        print("valgrind not found: no instruction counts (apt-get install valgrind)")
    if args.instructions_only or args.instructions:
        return
    for entry in ENTRY_POINTS:
        _run("import torch_overlay", entry, warm)  # fill the code cache and the OS file cache

    base, over = [], []
    for _ in range(args.runs):
        base.append(_run("", "", warm)[0])
        over.append(_run("import torch_overlay", "", warm)[0])
    b, o = statistics.median(base), statistics.median(over)
    print(
        f"import torch: {b * 1e3:7.1f} ms alone, {o * 1e3:7.1f} ms with torch_overlay (ratio {o / b:.3f}; wall time, noisy)"
    )

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
