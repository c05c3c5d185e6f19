"""A PyTorch git checkout: validation, version, file texts at HEAD and in the working tree."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..series.versions import support_note
from . import BuildError
from ._paths import confined

__all__ = ["Checkout", "open_checkout"]


@dataclass
class Checkout:
    root: Path
    version: str  # version.txt, e.g. "2.13.0a0" (read as the 2.13.0 release line)

    def git(self, *args: str, input: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            ["git", "-C", str(self.root), *args],
            input=input,
            capture_output=True,
            text=True,
            # A translated or paged git would break the parsing below.
            env={**os.environ, "LC_ALL": "C", "GIT_PAGER": "cat", "GIT_TERMINAL_PROMPT": "0"},
        )
        if check and proc.returncode != 0:
            raise BuildError(f"git {' '.join(args)} failed in {self.root}: {proc.stderr.strip()}")
        return proc.stdout

    def head_text(self, path: str) -> str | None:
        proc = subprocess.run(["git", "-C", str(self.root), "show", f"HEAD:{path}"], capture_output=True)
        return proc.stdout.decode("utf-8") if proc.returncode == 0 else None

    def path(self, relative: str, what: str = "path") -> Path:
        """The file at ``relative``, refused unless it is inside the checkout."""
        return confined(self.root, relative, what)

    def work_text(self, path: str) -> str | None:
        file = self.path(path)
        # Bytes, not read_text: no newline translation, so an unchanged file round-trips exactly.
        return file.read_bytes().decode("utf-8") if file.is_file() else None

    def changed_paths(self) -> list[str]:
        """Tracked files whose index or working-tree copy differs from HEAD."""
        out = self.git("status", "--porcelain=v1", "-z", "--untracked-files=no")
        paths = []
        entries = iter(out.split("\0"))
        for entry in entries:
            if not entry:
                continue
            paths.append(entry[3:])
            if entry[0] in "RC":  # a rename's source path follows
                paths.append(next(entries, ""))
        return paths

    def branch(self) -> str:
        """The current branch, or the HEAD commit when detached."""
        name = self.git("symbolic-ref", "-q", "--short", "HEAD", check=False).strip()
        return name or self.git("rev-parse", "HEAD").strip()

    def git_dir(self) -> Path:
        return Path(self.git("rev-parse", "--absolute-git-dir").strip())

    def write(self, texts: dict[str, str]) -> None:
        """Write every text, each through a temporary file renamed over the original."""
        targets = {path: self.path(path) for path in texts}  # every path checked before any write
        staged: list[tuple[Path, Path]] = []
        try:
            for path, text in texts.items():
                target = targets[path]
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
                with os.fdopen(fd, "wb") as f:
                    f.write(text.encode("utf-8"))
                mode = target.stat().st_mode if target.exists() else 0o644
                os.chmod(name, mode & 0o7777)
                staged.append((Path(name), target))
        except BaseException:
            for tmp, _ in staged:
                tmp.unlink(missing_ok=True)
            raise
        for tmp, target in staged:
            os.replace(tmp, target)


def open_checkout(path: Path | str) -> Checkout:
    """Validate ``path`` as the top of a PyTorch git checkout; raise ``BuildError`` if it is not."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise BuildError(f"{root} is not a directory")
    root = root.resolve()
    version_file = root / "version.txt"
    if not (root / "torch" / "__init__.py").is_file() or not version_file.is_file():
        raise BuildError(f"{root} is not a PyTorch checkout (expected version.txt and torch/__init__.py)")
    version = version_file.read_text(encoding="utf-8").strip()
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?\S*", version):
        raise BuildError(f"{version_file}: cannot read a version from {version!r}")
    proc = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise BuildError(f"{root} is not a git checkout with a commit: {proc.stderr.strip()}")
    top = Path(proc.stdout.splitlines()[0]).resolve()
    if top != root:
        raise BuildError(f"{root} is inside the git repository {top}; pass the top of the PyTorch checkout")
    note = support_note(version)
    if note:
        print(f"warning: {version_file}: {note}", file=sys.stderr)
    return Checkout(root, version)
