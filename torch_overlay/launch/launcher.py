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

from .env import BOOTSTRAP, launch_env

__all__ = ["launch_env", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="torch-overlay-run",
        description="Run CMD with torch_overlay imported first in every Python process it starts.",
        epilog="example: torch-overlay-run torchrun --nproc_per_node 8 train.py --config x.toml",
    )
    parser.add_argument(
        "--check-ranks",
        action="store_true",
        help="after init_process_group, check that every rank runs the same torch and fixes",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
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
    env = launch_env(os.environ, check_ranks=args.check_ranks)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(executable, command, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
