"""``python -m torch_overlay warm``: after it, a new process compiles nothing and reads no file of a
module it does not import; a second ``warm`` finds everything in the cache."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

from torch_overlay.engine.warm import warm

from .test_apply import _state, overlays, PATCHED  # noqa: F401  (overlays is a fixture)
from .test_decision_record import _new_process, _reads, two_modules  # noqa: F401  (two_modules is a fixture)

REPO = Path(__file__).resolve().parents[2]


def _compiles(monkeypatch):
    """The patched modules compiled from now on."""
    from torch_overlay.engine import modcode

    seen: list[str] = []
    original = modcode._build

    def build(module_name, *args, **kwargs):
        seen.append(module_name)
        return original(module_name, *args, **kwargs)

    monkeypatch.setattr(modcode, "_build", build)
    return seen


def test_warm_compiles_every_module_without_importing_it(two_modules, config, overlays, tmp_path, monkeypatch):
    first, second, second_file = two_modules
    one = _new_process(overlays, config, tmp_path, None, [first, second])
    compiled = _compiles(monkeypatch)
    report = warm(one)
    assert sorted(report.compiled) == sorted([first, second]) and report.cached == []
    assert sorted(compiled) == sorted([first, second])
    assert first not in sys.modules and second not in sys.modules
    assert "2 patched module(s) ready" in report.line() and "2 compiled now" in report.line()

    # The job's process: decision recalled, code loaded, nothing compiled, the second file not read.
    compiled.clear()
    two = _new_process(overlays, config, tmp_path, one, [first, second])
    reads = _reads(monkeypatch)
    assert importlib.import_module(first).answer() == 42
    assert compiled == [] and second_file.name not in reads
    assert two._by_module[first].remembered
    assert _state(two, "fix").state == "pending"  # the second module is still to come

    # warm again: all there.
    three = _new_process(overlays, config, tmp_path, two, [first, second])
    again = warm(three)
    assert again.compiled == [] and sorted(again.cached) == sorted([first, second])
    assert compiled == []


def test_warm_rebuilds_code_missing_under_a_kept_decision(two_modules, config, overlays, tmp_path, monkeypatch):
    first, second, _ = two_modules
    one = _new_process(overlays, config, tmp_path, None, [first, second])
    warm(one)
    code_key = one._by_module[first].modules[first].code.key
    (tmp_path / "code" / f"{one._cache._entry(code_key)[0].name}").unlink()
    two = _new_process(overlays, config, tmp_path, one, [first, second])
    report = warm(two)
    assert report.compiled == [first] and report.cached == [second]


def test_warm_without_a_code_cache_says_so(two_modules, config, overlays, tmp_path):
    overlay = overlays(config(cache_dir=tmp_path, code_cache=False))  # TORCH_OVERLAY_CODE_CACHE=0
    overlay.activate()
    report = warm(overlay)
    assert report.folder is None and "no code cache" in report.line()


def test_warm_command(tmp_path):
    """The command as a user runs it, on the installed torch: first compiles, then all cached."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_OVERLAY_CACHE_DIR": str(tmp_path)}
    env.pop("TORCH_OVERLAY_PATCHES", None)
    cmd = [sys.executable, "-m", "torch_overlay", "warm", "--json"]
    first = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
    second = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
    assert second["compiled"] == [] and sorted(second["cached"]) == sorted(first["compiled"] + first["cached"])
    assert first["folder"] == str(tmp_path / "code")
    # A job's import then compiles nothing: no new entry in the cache.
    before = sorted(p.name for p in (tmp_path / "code").iterdir())
    code = "import torch_overlay, torch, torch.distributed.tensor"
    subprocess.run([sys.executable, "-c", code], env={**env, "TORCH_OVERLAY_QUIET": "1"}, check=True)
    assert sorted(p.name for p in (tmp_path / "code").iterdir()) == before
