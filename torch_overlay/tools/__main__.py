"""``python -m torch_overlay.tools apply|wheel|stage|compare`` (what ``./build.sh VERB`` runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._config import load_config
from ..series.series import SeriesError
from . import BuildError


def _add_patches(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--patches",
        type=Path,
        default=None,
        metavar="DIR",
        help="the patches folder holding `series` (default: TORCH_OVERLAY_PATCHES or the shipped one)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./build.sh", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True)

    p = sub.add_parser(
        "apply",
        help="apply the patch series to a PyTorch git checkout",
        description="Apply the series to a PyTorch git checkout, with the variant of each patch that fits "
        "its version.txt. Everything is checked first: a dirty tree, a folder that is not a PyTorch "
        "checkout or a drifted patch is refused and nothing changes. Patches already present are "
        "reported `upstream` and skipped, so a second run changes nothing.",
    )
    p.add_argument("src", type=Path, metavar="PYTORCH_SRC")
    p.add_argument(
        "--check", action="store_true", help="only report per patch: would apply / upstream / drift (exit 1 on drift)"
    )
    p.add_argument("--reverse", action="store_true", help="undo an earlier (uncommitted) apply")
    _add_patches(p)

    p = sub.add_parser(
        "wheel",
        help="rebuild a torch wheel with the series applied",
        description="Rebuild WHEEL (default: the installed torch's wheel, from pip's find-links or cache, "
        "else from the installed files) with the series applied to its Python files and the local "
        "version label overlay.N (N patches applied). Patches that are `upstream` for it are skipped.",
    )
    p.add_argument("wheel", type=Path, nargs="?", metavar="WHEEL")
    p.add_argument("--out", type=Path, default=Path("dist"), metavar="DIR", help="output folder (default: ./dist)")
    _add_patches(p)

    p = sub.add_parser(
        "stage",
        help="one upstream-style commit per patch, on a new branch",
        description="On a new branch of a clean PyTorch checkout, commit each patch that applies with its "
        "test at its Upstream-Test path and a PyTorch-style message (title, summary, Fixes #N, test "
        "plan), ready for ghstack; write a PR body <id>.md per patch. Offline; changes nothing "
        "outside the checkout unless --out points elsewhere.",
    )
    p.add_argument("src", type=Path, metavar="PYTORCH_SRC")
    p.add_argument("--branch", default=None, help="branch to create (default: torch-overlay/<series hash>)")
    p.add_argument(
        "--out", type=Path, default=None, metavar="DIR", help="PR body folder (default: inside the checkout's .git)"
    )
    _add_patches(p)

    p = sub.add_parser(
        "compare",
        help="run a test file without and with the overlay; list tests whose outcome differs",
        description="Run TEST_FILE (e.g. one of PyTorch's own test files for a module a patch touches, "
        "fetched into a scratch folder) with pytest twice, through the launcher: without and with the "
        "overlay, each with its own compile caches. List every test whose outcome differs; exit 1 if "
        "one that passes without the overlay fails with it. Also list each test's time both ways and "
        "flag a SLOWDOWN (over x1.2 and 5 s more with the overlay; reported, not a failure). Per applied "
        "fix, say how many tests ran the functions it changes (reach).",
    )
    p.add_argument("test_file", type=Path, metavar="TEST_FILE")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="seconds per run (default: none)")
    p.add_argument(
        "--no-reach",
        dest="reach",
        action="store_false",
        help="do not count reach (on Python 3.11 it takes a third run of the file, with the overlay)",
    )
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the comparison as data to FILE")
    p.epilog = "Arguments after -- are passed to pytest (e.g. -- -k 'subclass')."

    p = sub.add_parser(
        "matrix",
        help="tabulate status and verify reports of several torch versions (what build.sh matrix runs)",
        description="Read <version>.status.json and <version>.verify.json reports, write the fix x torch "
        "table, and exit 1 if a measured cell contradicts a patch's Affects, Introduced or Applied-Upstream "
        "field, or a fix does not fix.",
    )
    p.add_argument("reports", type=Path, nargs="+", metavar="REPORT")
    p.add_argument("--out", type=Path, required=True, metavar="FILE")
    _add_patches(p)

    p = sub.add_parser(
        "capture",
        help="store what each needed fix's reproducer raises without the overlay on the installed torch",
        description="Run each fix's Error-Test (default: its Quick-Test) that the installed torch needs, "
        "without the overlay, and store the exception it raised in patches/captured/<release>.json "
        "(what build.sh matrix runs on each torch; explain's signatures are tested against it).",
    )
    p.add_argument("--ids", default="", metavar="ID,...", help="only these fixes (the others keep their entries)")
    p.add_argument("--out", type=Path, default=None, metavar="FILE", help="default: patches/captured/<release>.json")
    _add_patches(p)

    p = sub.add_parser(
        "catalogue",
        help="regenerate the catalogue's pages (docs/reference/: the fixes, a page per fix, the reports looked at)",
        description="Rewrite docs/reference/fixes.md, docs/reference/fixes/<id>.md and docs/reference/looked-at.md "
        "from the series' fields and looked-at.toml; with --check, exit 1 when they differ instead.",
    )
    p.add_argument("--docs", type=Path, default=Path(__file__).resolve().parents[2] / "docs")
    p.add_argument("--check", action="store_true")
    _add_patches(p)

    p = sub.add_parser(
        "conformance",
        help="the conformance record: regenerate docs/measurements/conformance.md (--check: compare), or rerun it",
        description="Without --run: check the record (docs/measurements/conformance.toml) against the series and "
        "regenerate its page; with --check, exit 1 when a changed torch file has no row or the page is stale. "
        "With --run DIR: run the recorded upstream test files found in DIR (a PyTorch checkout's test/) through "
        "`build.sh compare` on the oldest and newest torch of their fixes, and write the results into the record.",
    )
    p.add_argument("--check", action="store_true")
    p.add_argument("--run", type=Path, default=None, metavar="UPSTREAM_TESTS_DIR")
    p.add_argument(
        "--files", default="", metavar="TORCH_FILE,...", help="with --run: only the rows of these torch files"
    )
    p.add_argument("--timeout", type=float, default=3600.0, help="with --run: seconds per pytest run (default 3600)")
    _add_patches(p)

    argv = sys.argv[1:] if argv is None else list(argv)
    # Everything after -- belongs to pytest; split it off first, since argparse's own handling
    # of -- inside a subcommand would reject it.
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    args = parser.parse_args(argv)
    if args.verb == "compare":
        from .compare import run_compare

        return run_compare(args.test_file, pytest_args, timeout=args.timeout, reach=args.reach, json_out=args.json)
    if pytest_args:
        parser.error(f"{args.verb} takes no arguments after --")
    patches = (args.patches or load_config().patches_dir).resolve()
    if args.verb == "conformance":
        from .conformance import run_check, run_conformance

        root = Path(__file__).resolve().parents[2]
        if args.run is not None:
            only = {f for f in args.files.split(",") if f}
            return run_conformance(root, patches, args.run.resolve(), only, args.timeout)
        return run_check(root, patches, write=not args.check)
    if args.verb == "catalogue":
        from .catalogue_pages import run_catalogue

        return run_catalogue(args.docs, patches, check=args.check)
    if args.verb == "capture":
        from .capture import run_capture

        return run_capture(patches, args.out, {i for i in args.ids.split(",") if i})
    if args.verb == "matrix":
        from ..series.series import read_series
        from .matrix import run_matrix

        return run_matrix(args.reports, read_series(patches), args.out)
    try:
        if args.verb == "apply":
            from .apply import run_apply

            return run_apply(args.src, patches, check=args.check, reverse=args.reverse)
        if args.verb == "wheel":
            from .wheel import run_wheel

            return run_wheel(args.wheel, args.out, patches)
        from .stage import run_stage

        return run_stage(args.src, patches, out_dir=args.out, branch=args.branch)
    except (BuildError, SeriesError) as exc:
        sys.stdout.flush()
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
