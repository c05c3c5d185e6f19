from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.tools._standin import installed_torches, make_standin, reset


@pytest.fixture(scope="session")
def standin_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Path]]:
    """``(release) -> template checkout``, built once per session; skips if that torch is absent."""
    built: dict[str, Path] = {}

    def get(release: str) -> Path:
        if release not in built:
            torch = installed_torches().get(release)
            if torch is None:
                pytest.skip(f"torch {release} is not installed here (no venv under ~/.cache/torch_overlay/venvs)")
            built[release] = make_standin(torch, tmp_path_factory.mktemp(f"standin-{release}"))
        return built[release]

    yield get
    # ~50 MB each: do not leave them to pytest's retention of old temporary folders.
    for path in built.values():
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def checkout(standin_template: Callable[[str], Path]) -> Callable[[str], Path]:
    """``(release) -> that release's stand-in checkout``, reset to its first commit on ``main``.

    Resetting the session's checkout costs a fraction of a second; a fresh clone writes ~50 MB.
    """

    def make(release: str) -> Path:
        return reset(standin_template(release))

    return make


@pytest.fixture
def build_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """Run ``python -m torch_overlay.tools ARGS`` in this process: (exit status, stdout, stderr)."""
    from torch_overlay.tools.__main__ import main

    def run(*args: str | Path) -> tuple[int, str, str]:
        capsys.readouterr()
        rc = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return rc, out, err

    return run
