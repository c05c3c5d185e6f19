"""``python -m torch_overlay status|verify|explain|run`` (the ``torch-overlay`` console script)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import torch_overlay

from .report import format_late_imports, format_status, status_summary, to_json, wrap
from .verify import format_verdicts, Kind, needed_ids, verify
from .._version import __version__
from ..engine.overlay import process_overlay
from ..series.versions import torch_version


# Import these before a target inside them: some internals can't be imported first on their own.
_ENTRY_POINTS = {
    "torch._functorch._aot_autograd.": "torch._functorch.aot_autograd",
    "torch._functorch.": "torch._functorch.aot_autograd",
    "torch._inductor.": "torch._inductor.compile_fx",
    "torch.distributed.tensor.": "torch.distributed.tensor",
}


def _import_targets() -> None:
    """Import every target module so that each patch reaches its final state."""
    for row in torch_overlay.status():
        if row.state != "pending":
            continue
        for target in row.targets:
            name = target.module
            entry = next((e for prefix, e in _ENTRY_POINTS.items() if name.startswith(prefix)), None)
            try:
                if entry:
                    importlib.import_module(entry)
                importlib.import_module(name)
            except ImportError as exc:  # the patch stays pending; say why
                print(f"note: cannot import {name}: {exc}", file=sys.stderr)


# Run in a fresh Python: `import torch` first, then the overlay, as a script that imports it too late.
_LATE_PROBE = """
import json, sys
import torch
import torch_overlay
rows = torch_overlay.status()
loaded = sorted({t.module for r in rows for t in r.targets} & set(sys.modules))
rows = [r for r in rows if {t.module for t in r.targets} & set(loaded)]
print(json.dumps({"loaded": loaded, "rows": [[r.id, str(r.state), r.late] for r in rows]}))
"""


# Said by `status`: what a cold code cache costs, and how to pay it once ahead of a job.
COLD_CACHE_NOTE = (
    "The first import of a patched module after installing torch_overlay or upgrading torch compiles "
    "it (in every process that finds the cache cold: each rank of a job starting together); the code "
    "is kept in {folder} for the next ones. `python -m torch_overlay warm` compiles every patched "
    "module ahead, without importing them: run it once per machine (and user) before a job."
)


def late_import_probe() -> dict[str, object] | None:
    """What importing torch before torch_overlay does here, measured in a fresh Python: the patched
    modules ``import torch`` loads, the fixes it costs and those swapped in late; None if it cannot run."""
    import subprocess

    from ..launch.env import BOOTSTRAP

    env = dict(os.environ, TORCH_OVERLAY_QUIET="1")
    # This process's bootstrap would import the overlay first; the probe needs only the package.
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p) != BOOTSTRAP]
    env["PYTHONPATH"] = os.pathsep.join([str(Path(torch_overlay.__file__).resolve().parents[1]), *rest])
    try:
        proc = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", _LATE_PROBE], env=env, capture_output=True, text=True, timeout=300
        )
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return {
        "imported_by_import_torch": found["loaded"],
        "lost": [pid for pid, state, late in found["rows"] if state == "failed" and late],
        # Their changed functions are swapped in (a patch of other modules too applies at their import).
        "swapped": [pid for pid, state, _ in found["rows"] if state in ("applied", "pending")],
    }


def _can_import(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def cmd_status(args: argparse.Namespace) -> int:
    if not args.lazy:
        _import_targets()
    rows = torch_overlay.status()
    overlay = process_overlay()
    problems = overlay.problems
    probe = None if args.lazy or not overlay.config.enabled else late_import_probe()
    if args.json:
        extra: dict[str, object] = {"late_import": probe} if probe is not None else {}
        reach = torch_overlay.reach()  # TORCH_OVERLAY_REACH=1: what this process ran, importing included
        if reach is not None:
            extra["reach"] = reach
        print(to_json(rows, torch=torch_version(), **extra))
    else:
        width = shutil.get_terminal_size((120, 24)).columns
        patches = {p.id: p for p in overlay.patches()}
        where = f"torch {torch_version()}; patches from {overlay.config.patches_dir}"
        print("\n".join(wrap(where, width)))
        print(format_status(rows, patches, width))
        print("\n".join(wrap(COLD_CACHE_NOTE.format(folder=overlay.config.cache_dir / "code"), width)))
        if probe is not None:
            print("\n".join(wrap(format_late_imports(probe), width)))
        print(status_summary(rows, len(problems)))
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    bad = [r for r in rows if r.state in ("drift", "failed")]
    return 1 if bad or problems else 0


def cmd_warm(args: argparse.Namespace) -> int:
    from ..engine.warm import warm

    overlay = process_overlay()
    if not overlay.config.enabled:
        print("torch_overlay is disabled here (TORCH_OVERLAY=0): nothing to compile", file=sys.stderr)
        return 0
    report = warm(overlay)
    if args.json:
        print(
            json.dumps(
                {
                    "torch": torch_version(),
                    "folder": report.folder,
                    "compiled": report.compiled,
                    "cached": report.cached,
                }
            )
        )
    else:
        print(f"torch {torch_version()}: {report.line()}")
    for problem in overlay.problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if report.folder is None or overlay.problems else 0


def cmd_verify(args: argparse.Namespace) -> int:
    overlay = process_overlay()
    repo = Path(overlay.config.patches_dir).parent
    series = overlay.patches()
    known = [p.id for p in series]
    unknown = [i for i in args.ids if i not in known]
    if unknown:
        print(f"error: unknown patch id(s) {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    if not (repo / "tests").is_dir():
        print(
            f"error: verify runs from a source checkout of torch_overlay: it runs each fix's "
            f"reproducer tests, which the installed package does not ship ({repo} has no tests/ "
            f"folder); run `./build.sh verify` in a checkout",
            file=sys.stderr,
        )
        return 2
    if not _can_import("pytest"):  # each reproducer runs in `python -m pytest`
        print(
            f"error: verify runs each fix's reproducer with pytest, which this Python ({sys.executable}) "
            f"cannot import: pip install '.[test]' in the checkout (an installed package: "
            f"pip install 'torch_overlay[test]')",
            file=sys.stderr,
        )
        return 2
    patches = [p for p in series if not args.ids or p.id in args.ids]
    if args.needed:
        # Planned over the whole series: a fix may apply on top of earlier fixes to its files.
        needed = needed_ids(series)
        patches = [p for p in patches if p.id in needed]
    left_out: list = []
    if args.budget is not None:
        from .budget import within_budget
        from .timings import Timings

        patches, left_out = within_budget(
            patches, Timings(torch_version(), "quick" if args.quick else "full"), args.budget
        )
    verdicts = verify(
        patches,
        repo,
        quick=args.quick,
        jobs=args.jobs,
        timeout=args.timeout,
        torch_version=torch_version(),
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    if args.json:
        left = {"left_out": [p.id for p in left_out]} if args.budget is not None else {}
        print(json.dumps({"torch": torch_version(), "verdicts": [v.as_dict() for v in verdicts], **left}, indent=2))
    else:
        what = "the smallest reproducer of each fix" if args.quick else "each fix's reproducer tests"
        print(f"torch {torch_version()}: {what}, without and with the overlay")
        print(format_verdicts(verdicts, shutil.get_terminal_size((120, 24)).columns - 8))
        if left_out:
            print(
                f"{len(left_out)} fix(es) left out to finish within {args.budget:.0f} s (their reproducers took "
                f"longest last time: {', '.join(p.id for p in left_out)}); `verify` without --budget runs them"
            )
        print(closing_count(verdicts))
    # A fix whose tests all skipped here is reported, not failed: nothing showed it broken.
    broken = [v for v in verdicts if v.kind in Kind.FAILING]
    return 1 if broken else 0


def closing_count(verdicts: list) -> str:
    """``28/28 fixed``, or ``26/28 fixed; 1 NOT FIXED, 1 not needed on this torch``: the table in a line."""
    fixed = [v for v in verdicts if v.kind == Kind.FIXED]
    others: dict[str, int] = {}
    for v in verdicts:
        if v.kind != Kind.FIXED:
            label = Kind.LABELS[v.kind]
            others[label] = others.get(label, 0) + 1
    rest = ", ".join(f"{n} {label}" for label, n in others.items())
    count = f"{len(fixed)}/{len(verdicts)} fixed (bug present without the overlay, fixed with it)"
    return count + (f"; {rest}" if rest else "")


def cmd_explain(args: argparse.Namespace) -> int:
    from .explain import run_explain

    return run_explain(args, Path(process_overlay().config.patches_dir))


def main_run() -> int:
    """The ``torch-overlay-run`` console script."""
    from ..launch.launcher import main as launch

    return launch(sys.argv[1:])


def main(argv: list[str] | None = None) -> int:
    prog = "torch-overlay" if Path(sys.argv[0]).name == "torch-overlay" else "python -m torch_overlay"
    parser = argparse.ArgumentParser(prog=prog, description="Fixes for PyTorch internals on released torch.")
    parser.add_argument("--version", action="version", version=f"torch_overlay {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    p = sub.add_parser("status", help="state of every patch for the installed torch")
    p.add_argument("--json", action="store_true")
    p.add_argument("--lazy", action="store_true", help="do not import the target modules first")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser(
        "warm",
        help="compile every patched module into the code cache ahead of a job (what the first import after an install does)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_warm)
    p = sub.add_parser("verify", help="run each reproducer without and with the overlay")
    p.add_argument("ids", nargs="*", help="patch ids (default: all)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run")
    p.add_argument("--quick", action="store_true", help="only each fix's smallest test (its Quick-Test field)")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="pytest runs at a time (default: cores)")
    p.add_argument("--needed", action="store_true", help="only the fixes the installed torch needs")
    p.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="leave out the slowest reproducers (by the last run's times) to finish in about SECONDS",
    )
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser(
        "explain",
        help="which known torch bug each error of a traceback or job log is, and whether it is fixed here",
        description="Read tracebacks or whole job logs (FILEs, or standard input) and say, per distinct error, "
        "which known bug it is, which torch releases have it, and what that means for the installed torch "
        "(or --torch VERSION). Exit status: 0 every error is known, 1 one is not (or none was found), "
        "2 an input cannot be read.",
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="a traceback or log ('-' or none: standard input)")
    p.add_argument("--torch", metavar="VERSION", help="answer for this torch release instead of the installed one")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_explain)
    sub.add_parser(
        "run",
        help="[--check-ranks[=warn|fail]] -- CMD ...: run CMD with torch_overlay imported first in every Python process",
    )
    argv = sys.argv[1:] if argv is None else argv
    # The job's lines are for a job: `status` imports torch here to report, not to train.
    process_overlay().job.enabled = False
    if argv[:1] == ["run"]:
        from ..launch.launcher import main as launch  # its own options; everything after them is the command

        return launch(argv[1:])
    args = parser.parse_args(argv)
    if args.command is None:  # a bare `torch-overlay`: what it can do
        parser.print_help(sys.stderr)
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
