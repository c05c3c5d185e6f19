import importlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path


from torch_overlay.engine.overlay import Overlay
from torch_overlay.series.versions import parse_version, torch_version

from ._fixtures import make_diff, make_patch

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch.distributed.tensor", "torch._inductor", "torch._functorch.partitioners", "torch._dynamo")


def _run(code: str, **env: str) -> str:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    proc = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def test_import_is_lazy():
    out = _run(
        "import sys, json\n"
        "import torch_overlay\n"
        "no_torch = 'torch' not in sys.modules\n"
        "import torch\n"
        f"print(json.dumps([no_torch] + [m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    no_torch, *loaded = json.loads(out)
    assert no_torch, "import torch_overlay must not import torch"
    assert loaded == []


def test_real_series_reaches_its_state_when_dtensor_is_imported():
    out = _run(
        "import torch_overlay, json\n"
        "import torch.distributed.tensor\n"
        "print(json.dumps({s.id: s.state for s in torch_overlay.status()}))\n"
    )
    states = json.loads(out)
    expected = "applied" if parse_version(torch_version()) < (2, 13, 0) else "upstream"
    assert states["dtensor-new-empty-partial"] == expected


def test_env_switches():
    out = _run(
        "import torch_overlay, json; print(json.dumps([s.state for s in torch_overlay.status()]))", TORCH_OVERLAY="0"
    )
    assert set(json.loads(out)) == {"disabled"}
    out = _run(
        "import torch_overlay, json; print(json.dumps({s.id: s.reason for s in torch_overlay.status()}))",
        TORCH_OVERLAY_DISABLE="dtensor-new-empty-partial",
    )
    assert json.loads(out)["dtensor-new-empty-partial"] == "TORCH_OVERLAY_DISABLE"


SLOW = "import time\ntime.sleep(0.3)\n\n\ndef f():\n    return {v}\n"


def test_two_threads_importing_at_once(sandbox, config):
    names, patches = [], []
    for i in range(4):
        name, path = sandbox.module(SLOW.format(v=i))
        names.append(name)
        patches.append(
            (f"000{i}-p{i}.patch", make_patch(f"p{i}", [make_diff(path, SLOW.format(v=i), SLOW.format(v=i + 100))]))
        )
    sandbox.series(*patches)
    overlay = Overlay(config())
    overlay.activate()
    barrier = threading.Barrier(4)
    errors = []

    def worker(index: int) -> None:
        try:
            barrier.wait()
            # Every thread imports every module, in a different order.
            for name in names[index:] + names[:index]:
                importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert [s.state for s in overlay.status()] == ["applied"] * 4
        assert [sys.modules[n].f() for n in names] == [100, 101, 102, 103]
    finally:
        overlay.revert()
