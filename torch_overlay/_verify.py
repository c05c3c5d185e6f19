"""Run each patch's reproducer without and with the overlay, in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ._series import Patch

__all__ = ["Verdict", "verify_patch"]

VERDICTS = {
    (False, True): "bug present without, fixed with the overlay",
    (True, True): "not needed on this torch (passes without the overlay)",
    (False, False): "NOT FIXED: the reproducer fails with the overlay",
    (True, False): "REGRESSION: passes without the overlay, fails with it",
}


@dataclass
class Verdict:
    id: str
    test: str
    without: str  # "pass" / "fail" / "error"
    with_: str
    verdict: str
    seconds: float

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "test": self.test,
            "without_overlay": self.without,
            "with_overlay": self.with_,
            "verdict": self.verdict,
            "seconds": round(self.seconds, 1),
        }


def _run(cmd: list[str], overlay: bool, cwd: Path, timeout: float) -> tuple[str, str]:
    env = dict(os.environ)
    env["TORCH_OVERLAY"] = "1" if overlay else "0"
    env.pop("TORCH_OVERLAY_DISABLE", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cwd), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as cache:
        # Fresh compile caches for each run, so neither run reuses the other's graphs.
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
        try:
            proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "error", f"timed out after {timeout:.0f}s"
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    if proc.returncode == 0:
        return "pass", tail[0]
    return ("fail" if proc.returncode == 1 else "error"), tail[0]


def verify_patch(patch: Patch, repo: Path, timeout: float = 900.0) -> Verdict:
    main = patch.main
    test = main.fields.get("Test", "") if main else ""
    if not test or not (repo / test).is_file():
        return Verdict(patch.id, test, "-", "-", "no reproducer test found", 0.0)
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test]
    select = main.fields.get("Test-Select", "") if main else ""
    if select:
        cmd += ["-k", select]
    start = time.monotonic()
    without, _ = _run(cmd, overlay=False, cwd=repo, timeout=timeout)
    with_, tail = _run(cmd, overlay=True, cwd=repo, timeout=timeout)
    if "error" in (without, with_):
        verdict = f"could not run the reproducer ({tail})"
    else:
        verdict = VERDICTS[(without == "pass", with_ == "pass")]
    return Verdict(patch.id, test + (f" -k '{select}'" if select else ""), without, with_, verdict, time.monotonic() - start)
