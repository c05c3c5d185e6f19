"""``python -m torch_overlay run -- CMD ...`` (``torch-overlay-run CMD ...``): run a job unmodified,
with every Python process in it importing torch_overlay first.

Like ``ddtrace-run``: the command is executed with a bootstrap folder first on ``PYTHONPATH`` whose
``sitecustomize`` imports torch_overlay and then runs the ``sitecustomize`` it shadows. Child
processes inherit the environment, so torchrun workers and multiprocessing children get it too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from ..engine.once_per_job import release_exit_line
from .env import BOOTSTRAP, launch_env

__all__ = ["launch_env", "main"]

CHECK_RANKS_HELP = (
    "compare the ranks right after init_process_group: each rank's torch build and overlay fixes "
    "(one all-gather of 32 bytes per rank). Ranks that agree: rank 0 logs one INFO line "
    "'torch_overlay: ranks agree (N ranks, M patches)'. Ranks that differ: with --check-ranks "
    "(=warn) rank 0 warns which ranks differ and how, each line starting 'torch_overlay:', and the job "
    "goes on; with --check-ranks=fail (or TORCH_OVERLAY_STRICT=1) every rank raises "
    "torch_overlay.OverlayError and the job stops. A mode needs the '=' form"
)


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """The launcher's own options, and the command: from the first word that is not an option (or after ``--``)."""
    for i, word in enumerate(argv):
        if word == "--":
            return argv[:i], argv[i + 1 :]
        if not word.startswith("-"):
            return argv[:i], argv[i:]
    return argv, []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="torch-overlay-run",
        usage="%(prog)s [-h] [--check-ranks[=warn|fail]] [--] CMD [ARG ...]",
        description="Run CMD with torch_overlay imported first in every Python process it starts.",
        epilog="example: torch-overlay-run --check-ranks=fail torchrun --nproc_per_node 8 train.py --config x.toml",
    )
    # Only the `=` form takes a mode: `--check-ranks torchrun ...` must not read torchrun as one.
    parser.add_argument(
        "--check-ranks", nargs="?", const="warn", choices=("warn", "fail"), metavar="=warn|fail", help=CHECK_RANKS_HELP
    )
    options, command = _split(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(options)
    if not command:
        parser.error("no command given")
    if not (BOOTSTRAP / "sitecustomize.py").is_file():
        print(
            f"torch-overlay-run: {BOOTSTRAP / 'sitecustomize.py'} is missing, so the job would run without "
            "the overlay; reinstall torch_overlay (its package lacks the bootstrap)",
            file=sys.stderr,
        )
        return 2
    executable = shutil.which(command[0])
    if executable is None:
        print(f"torch-overlay-run: {command[0]}: command not found", file=sys.stderr)
        return 127
    # Built after `import torch_overlay` here: it carries what this process already warned about.
    env = launch_env(os.environ, check_ranks=args.check_ranks)
    # This process becomes CMD: CMD (or its rank 0) says at its exit which fixes it applied.
    release_exit_line(env)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(executable, command, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
