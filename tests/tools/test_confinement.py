"""apply, wheel and stage write only inside the checkout or output folder; a bad wheel is one error line."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.tools._standin import add_synthetic_patch, copy_series, git, IDENTITY, running_release

RELEASE = running_release()
ENV_TEXT = '"""A stand-in module."""\nVALUE = 1\n'


def _outside(tmp_path: Path) -> list[Path]:
    """Files written under ``tmp_path`` by a verb outside its checkout and output folder."""
    return sorted(p for p in tmp_path.rglob("escape_*"))


@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_stage_refuses_upstream_test_outside_the_checkout(where, checkout, build_cli, tmp_path):
    src = checkout(RELEASE)
    patches = copy_series(tmp_path / "repo", ids=[])
    path = "torch/_environment.py"
    base = (src / path).read_text()
    upstream = "../escape_test.py" if where == "relative" else str(tmp_path / "escape_test.py")
    add_synthetic_patch(patches, "synthetic-one", path, base, base + "# one\n", upstream_test=upstream)
    head = git(src, "rev-parse", "HEAD").strip()

    rc, _, err = build_cli("stage", src, "--patches", patches, "--out", tmp_path / "bodies")
    assert rc == 1 and "Upstream-Test" in err and upstream in err, err
    assert _outside(src.parent) == [] and _outside(tmp_path) == []
    assert git(src, "rev-parse", "HEAD").strip() == head
    assert git(src, "branch", "--format=%(refname:short)").split() == ["main"]
    assert not (tmp_path / "bodies").exists()


def _symlinked_module(src: Path, outside: Path) -> str:
    """Commit ``torch/solo/escape_mod.py``, then make ``torch/solo`` a symlink to a copy in ``outside``."""
    path = "torch/solo/escape_mod.py"
    (src / "torch" / "solo").mkdir()
    (src / path).write_text(ENV_TEXT)
    git(src, "add", path)
    git(src, *IDENTITY, "commit", "-q", "-m", "solo")
    outside.mkdir()
    (outside / "escape_mod.py").write_text(ENV_TEXT)
    subprocess.run(["rm", "-r", str(src / "torch" / "solo")], check=True)
    (src / "torch" / "solo").symlink_to(outside, target_is_directory=True)
    return path


def test_apply_refuses_a_path_through_a_symlink_out_of_the_checkout(checkout, build_cli, tmp_path):
    src = checkout(RELEASE)
    outside = tmp_path / "outside"
    path = _symlinked_module(src, outside)
    patches = copy_series(tmp_path / "repo", ids=[])
    add_synthetic_patch(patches, "synthetic-one", path, ENV_TEXT, ENV_TEXT + "# one\n")

    for args in (["--check"], []):
        rc, _, err = build_cli("apply", src, "--patches", patches, *args)
        assert rc == 1 and path in err and "outside" in err, err
    assert [p.name for p in outside.iterdir()] == ["escape_mod.py"]
    assert (outside / "escape_mod.py").read_text() == ENV_TEXT


def test_apply_refuses_dotdot_in_a_diff_path(checkout, build_cli, tmp_path):
    src = checkout(RELEASE)
    patches = copy_series(tmp_path / "repo", ids=[])
    path = "torch/../torch/_environment.py"
    base = (src / "torch/_environment.py").read_text()
    add_synthetic_patch(patches, "synthetic-one", path, base, base + "# one\n")
    rc, _, err = build_cli("apply", src, "--patches", patches)
    assert rc == 1 and path in err, err
    assert git(src, "status", "--porcelain") == ""


# ---------------------------------------------------------------- wheel


def _fake_wheel(folder: Path, version: str = "2.13.0", name: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / (name or "torch-2.13.0-cp311-cp311-linux_x86_64.whl")
    info = "torch-2.13.0.dist-info"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("torch/_environment.py", ENV_TEXT * 50)
        archive.writestr("torch/version.py", f"__version__ = '{version}'\n")
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nTag: cp311-cp311-linux_x86_64\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel


def _series(tmp_path: Path) -> Path:
    patches = copy_series(tmp_path / "repo", ids=[])
    add_synthetic_patch(patches, "synthetic-one", "torch/_environment.py", ENV_TEXT * 50, ENV_TEXT * 50 + "# one\n")
    return patches


def test_wheel_fake_builds(build_cli, tmp_path):
    """The fake wheel of these tests is a valid source: the refusals below are about what they change."""
    wheel = _fake_wheel(tmp_path / "in")
    rc, out, err = build_cli("wheel", wheel, "--out", tmp_path / "dist", "--patches", _series(tmp_path))
    assert rc == 0, err
    assert [p.name for p in (tmp_path / "dist").iterdir()] == ["torch-2.13.0+overlay.1-cp311-cp311-linux_x86_64.whl"]


def test_wheel_refuses_a_version_that_leads_outside_the_output_folder(build_cli, tmp_path):
    (tmp_path / "dist" / "torch-x").mkdir(parents=True)
    wheel = _fake_wheel(tmp_path / "in", version="x/../../escape")
    rc, _, err = build_cli("wheel", wheel, "--out", tmp_path / "dist", "--patches", _series(tmp_path))
    assert rc == 1 and err.startswith("error:") and "x/../../escape" in err, err
    assert _outside(tmp_path) == []


def _corrupt_member(wheel: Path) -> None:
    """Flip bytes inside the compressed data of the first member (the CRC no longer matches)."""
    with zipfile.ZipFile(wheel) as archive:
        info = archive.infolist()[0]
    data = bytearray(wheel.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for i in range(start + 2, start + 12):
        data[i] ^= 0xFF
    wheel.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["not-a-zip", "truncated", "bad-member"])
def test_wheel_on_a_corrupt_wheel_is_one_error_line(damage, build_cli, tmp_path):
    wheel = _fake_wheel(tmp_path / "in")
    if damage == "not-a-zip":
        wheel.write_bytes(b"not a zip file\n")
    elif damage == "truncated":
        wheel.write_bytes(wheel.read_bytes()[:200])
    else:
        _corrupt_member(wheel)
    rc, out, err = build_cli("wheel", wheel, "--out", tmp_path / "dist", "--patches", _series(tmp_path))
    assert rc == 1
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1 and str(wheel) in err, err
    assert not (tmp_path / "dist").exists() or list((tmp_path / "dist").iterdir()) == []
