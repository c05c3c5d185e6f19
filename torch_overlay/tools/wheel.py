"""``build.sh wheel [--out DIR] [WHEEL]``: a torch wheel rebuilt with the series applied.

The source is WHEEL, else the installed torch's own wheel when pip's find-links or cache hold it,
else the installed files themselves (listed by their RECORD). Patches that are ``upstream`` for that
torch are skipped; the others are applied to its Python files, and the version gets the local label
``overlay.N`` (N patches applied): ``2.13.0+cpu`` becomes ``2.13.0+cpu.overlay.1``. The
``.dist-info`` directory, ``METADATA``, ``WHEEL``, ``RECORD`` and ``torch/version.py`` follow.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import importlib.metadata
import io
import os
import platform
import re
import shlex
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..series.versions import torch_root
from . import BuildError
from ._paths import confined
from ..series.plan import Plan, load_series, plan_series

__all__ = ["find_torch_wheels", "overlay_version", "record_line", "run_wheel", "wheel_search_dirs"]

# A version as it may appear in a file name (PEP 440 public version and local label).
_VERSION_RE = re.compile(r"^[0-9][A-Za-z0-9.!_]*(\+[A-Za-z0-9.]+)?$")
_WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?-(?P<tags>[^-]+-[^-]+-[^-]+)\.whl$")
# Files an installer adds to .dist-info; a wheel does not carry them.
_INSTALLER_FILES = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


def overlay_version(version: str, applied: int) -> str:
    """``2.13.0+cpu`` -> ``2.13.0+cpu.overlay.N`` and ``2.11.0`` -> ``2.11.0+overlay.N`` (PEP 440)."""
    if re.search(r"[+.]overlay\.\d+", version):
        raise BuildError(f"torch {version} is already an overlay rebuild; rebuild from the original wheel")
    return f"{version}{'.' if '+' in version else '+'}overlay.{applied}"


def record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


@dataclass
class _Member:
    name: str
    info: zipfile.ZipInfo  # timestamp and permissions to keep
    read: Callable[[], bytes]


@dataclass
class _Source:
    description: str
    dist_info: str  # e.g. "torch-2.13.0+cpu.dist-info"
    tags: str  # e.g. "cp311-cp311-manylinux_2_28_x86_64"
    members: list[_Member]

    def __post_init__(self) -> None:
        self._by_name = {m.name: m for m in self.members}

    def member(self, name: str) -> _Member | None:
        return self._by_name.get(name)

    def text(self, name: str) -> str | None:
        member = self.member(name)
        return member.read().decode("utf-8") if member else None

    @property
    def metadata(self) -> str:
        text = self.text(f"{self.dist_info}/METADATA")
        if text is None:
            raise BuildError(f"{self.description}: no {self.dist_info}/METADATA")
        return text

    @property
    def version(self) -> str:
        m = re.search(r"^Version: *(\S+)", self.metadata, re.M)
        if not m:
            raise BuildError(f"{self.description}: no Version in METADATA")
        if not _VERSION_RE.match(m.group(1)):
            raise BuildError(f"{self.description}: METADATA Version {m.group(1)!r} is not a version")
        return m.group(1)


def _zip_source(path: Path, archive: zipfile.ZipFile) -> _Source:
    m = _WHEEL_RE.match(path.name)
    if not m:
        raise BuildError(f"{path.name} is not a wheel file name")
    infos = [i for i in archive.infolist() if not i.is_dir()]
    dist_infos = {i.filename.split("/")[0] for i in infos if i.filename.split("/")[0].endswith(".dist-info")}
    if len(dist_infos) != 1:
        raise BuildError(f"{path}: expected one .dist-info directory, found {sorted(dist_infos)}")
    members = [_Member(i.filename, i, lambda i=i: archive.read(i)) for i in infos]  # type: ignore[misc]  # i=i binds each
    return _Source(str(path), dist_infos.pop(), m.group("tags"), members)


def _installed_source() -> _Source:
    """The installed torch as a wheel would hold it, from the files its RECORD lists."""
    site = torch_root()
    dists = [d for d in importlib.metadata.distributions(path=[str(site)]) if d.metadata["Name"] == "torch"]
    files = dists[0].files if dists else None  # read from RECORD at each access
    if files is None:
        raise BuildError(f"no torch distribution with a RECORD in {site}")
    dist = dists[0]
    members = []
    dist_info = ""
    for file in files:
        parts = file.parts
        # Console scripts (../../bin) and bytecode are made by the installer, not shipped.
        if parts[0] == ".." or "__pycache__" in parts or file.suffix == ".pyc":
            continue
        if parts[0].endswith(".dist-info"):
            dist_info = parts[0]
            if parts[-1] in _INSTALLER_FILES and len(parts) == 2:
                continue
        path = Path(dist.locate_file(file))  # type: ignore[arg-type]  # a Path for an installed distribution
        info = zipfile.ZipInfo.from_file(path, file.as_posix())
        members.append(_Member(file.as_posix(), info, path.read_bytes))
    wheel = (site / dist_info / "WHEEL").read_text(encoding="utf-8")
    tags = [t.split("-") for t in re.findall(r"^Tag: *(\S+)", wheel, re.M)]
    joined = "-".join(".".join(dict.fromkeys(t[i] for t in tags)) for i in range(3))
    return _Source(f"installed torch in {site}", dist_info, joined, members)


def wheel_search_dirs() -> list[Path]:
    """Local folders pip looks in for wheels: ``find-links`` from its config and environment."""
    values = os.environ.get("PIP_FIND_LINKS", "").split()
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".find-links"):
            values += shlex.split(value)
    dirs: dict[Path, None] = {}
    for value in values:
        path = Path(value.removeprefix("file://"))
        if path.is_dir():
            dirs.setdefault(path.resolve(), None)
    return list(dirs)


def _pip_cache_wheels() -> list[Path]:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "cache", "list", "--format=abspath", "torch"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [Path(line) for line in proc.stdout.splitlines() if line.endswith(".whl")]


def _compatible(tags: str) -> bool:
    py, _, plat = tags.split("-")
    ours = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return (ours in py.split(".") or "py3" in py.split(".")) and (plat == "any" or platform.machine() in plat)


def find_torch_wheels(match: Callable[[str], bool] | None = None) -> Iterator[tuple[Path, str]]:
    """(path, version) of each torch wheel for this Python in pip's find-links and cache."""
    candidates = [p for d in wheel_search_dirs() for p in sorted(d.glob("torch-*.whl"))]
    for path in candidates + _pip_cache_wheels():
        m = _WHEEL_RE.match(path.name)
        if (
            m
            and m.group("name") == "torch"
            and _compatible(m.group("tags"))
            and (match is None or match(m.group("version")))
        ):
            yield path, m.group("version")


def _rewrite_version_py(text: str, applied: int) -> str:
    return re.sub(
        r"^(__version__\s*(?::\s*str\s*)?=\s*)(['\"])([^'\"]+)\2",
        lambda m: f"{m.group(1)}{m.group(2)}{overlay_version(m.group(3), applied)}{m.group(2)}",
        text,
        count=1,
        flags=re.M,
    )


def _write_wheel(source: _Source, plan: Plan, out_dir: Path) -> Path:
    applied = len(plan.applying)
    version = overlay_version(source.version, applied)
    stem = source.dist_info[: -len(".dist-info")]
    name = stem.rsplit("-", 1)[0]
    old_data, new_stem = f"{stem}.data", f"{name}-{version}"
    new_info = f"{new_stem}.dist-info"

    replaced: dict[str, bytes] = {p: plan.after[p].encode("utf-8") for p in plan.changed}
    version_py = source.text("torch/version.py")
    if version_py is not None:
        replaced["torch/version.py"] = _rewrite_version_py(version_py, applied).encode("utf-8")
    metadata = re.sub(r"^Version: *\S+", f"Version: {version}", source.metadata, count=1, flags=re.M)
    replaced[f"{source.dist_info}/METADATA"] = metadata.encode("utf-8")
    wheel_meta = source.text(f"{source.dist_info}/WHEEL") or ""
    wheel_meta = re.sub(r"^(Generator|Build):.*\n", "", wheel_meta, flags=re.M)
    replaced[f"{source.dist_info}/WHEEL"] = ("Generator: torch_overlay (build.sh wheel)\n" + wheel_meta).encode()

    def rename(arcname: str) -> str:
        top, sep, rest = arcname.partition("/")
        if top == source.dist_info:
            return f"{new_info}{sep}{rest}"
        if top == old_data:
            return f"{new_stem}.data{sep}{rest}"
        return arcname

    # Payload first and .dist-info last, RECORD at the very end, as installers expect.
    members = [m for m in source.members if m.name != f"{source.dist_info}/RECORD"]
    members.sort(key=lambda m: m.name.startswith(source.dist_info + "/"))
    out_dir.mkdir(parents=True, exist_ok=True)
    target = confined(out_dir, f"{name}-{version}-{source.tags}.whl", "wheel file")
    partial = target.with_name(target.name + ".part")
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    try:
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for member in members:
                data = replaced.get(member.name)
                data = member.read() if data is None else data
                arcname = rename(member.name)
                info = zipfile.ZipInfo(arcname, member.info.date_time)
                info.external_attr = member.info.external_attr
                info.compress_type = zipfile.ZIP_DEFLATED
                # Level 1: the shared libraries dominate; harder compression costs minutes for ~10%.
                archive.writestr(info, data, compresslevel=1)
                writer.writerow(record_line(arcname, data))
            writer.writerow([f"{new_info}/RECORD", "", ""])
            info = zipfile.ZipInfo(f"{new_info}/RECORD", members[-1].info.date_time)
            info.external_attr = 0o644 << 16
            archive.writestr(info, record.getvalue(), compress_type=zipfile.ZIP_DEFLATED)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def run_wheel(wheel: Path | None, out_dir: Path, patches_dir: Path, *, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    patches = load_series(patches_dir)
    with _open_source(wheel, out) as source:
        plan = plan_series(patches, source.version, source.text, python_only=True)
        out.write(
            f"wheel: {len(patches)} patch(es) from {patches_dir} on torch {source.version} ({source.description})\n"
        )
        for step in plan.steps:
            state = step.state
            out.write(f"  {state:<8}  {step.patch.id}  ({step.reason})\n")
        if plan.drifted:
            raise BuildError(
                "patch(es) do not fit this torch (drift): "
                + ", ".join(s.patch.id for s in plan.drifted)
                + "; no wheel was written"
            )
        target = _write_wheel(source, plan, out_dir)
    out.write(
        f"wrote {target}\ninstall: python -m pip install --force-reinstall --no-deps {shlex.quote(str(target))}\n"
    )
    return 0


@contextlib.contextmanager
def _open_source(wheel: Path | None, out: TextIO) -> Iterator[_Source]:
    """WHEEL, else the installed torch's original wheel, else its installed files."""
    if wheel is None:
        installed = _installed_source()
        wheel = next((p for p, _ in find_torch_wheels(lambda v: v == installed.version)), None)
        if wheel is None:
            out.write(
                f"no torch {installed.version} wheel in pip's find-links or cache: using the {installed.description}\n"
            )
            yield installed
            return
    if not wheel.is_file():
        raise BuildError(f"{wheel}: no such wheel")
    # Members are read while the caller holds the source: a damaged one fails there, not here.
    try:
        with zipfile.ZipFile(wheel) as archive:
            yield _zip_source(wheel, archive)
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise BuildError(f"{wheel}: not a readable wheel ({exc}); no wheel was written") from None
