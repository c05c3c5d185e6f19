"""A process that imported torch_overlay passes it to the Python processes it starts.

The parent imports the overlay inside ``if __name__ == "__main__":`` (so a spawned child, which
re-imports the script as ``__mp_main__``, never runs that line); each kind of child reports the
state of a fix whose module it imports.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIX = "aot-fresh-alias-outputs"  # unfixed upstream on every supported torch

JOB = textwrap.dedent(
    f"""
    import json, subprocess, sys

    import torch.multiprocessing as mp
    from torch.utils.data import DataLoader, Dataset

    REPORT = (
        "import sys, torch._functorch.aot_autograd\\n"
        "ov = sys.modules.get('torch_overlay')\\n"
        "state = None if ov is None else {{s.id: str(s.state) for s in ov.status()}}[{FIX!r}]\\n"
    )


    def report():
        scope = {{}}
        exec(REPORT, scope)
        return scope["state"]


    def spawned(rank, queue):
        queue.put(report())


    class OneItem(Dataset):
        def __len__(self):
            return 1

        def __getitem__(self, i):
            return report()


    if __name__ == "__main__":
        import torch_overlay  # noqa: F401  (here only: spawned children skip this block)

        out = {{"parent": report()}}
        if "mp.spawn" in sys.argv:
            queue = mp.get_context("spawn").SimpleQueue()
            mp.spawn(spawned, args=(queue,), nprocs=1)
            out["mp.spawn"] = queue.get()
        if "dataloader" in sys.argv:
            loader = DataLoader(OneItem(), batch_size=None, num_workers=1, multiprocessing_context="spawn")
            out["dataloader"] = next(iter(loader))
        if "subprocess" in sys.argv:
            code = REPORT + "print(repr(state))"
            out["subprocess"] = eval(subprocess.check_output([sys.executable, "-c", code], text=True))
        print(json.dumps(out))
    """
)


def _run(tmp_path: Path, *children: str, **env: str) -> dict[str, str | None]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    full = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")}
    full.update(PYTHONPATH=str(REPO), **env)
    proc = subprocess.run(
        [sys.executable, str(script), *children], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_spawned_workers_and_subprocesses_inherit_the_overlay(tmp_path):
    states = _run(tmp_path, "mp.spawn", "dataloader", "subprocess")
    assert states == {"parent": "applied", "mp.spawn": "applied", "dataloader": "applied", "subprocess": "applied"}


def test_children_inherit_the_parents_switches(tmp_path):
    states = _run(tmp_path, "subprocess", TORCH_OVERLAY_DISABLE=FIX)
    assert states == {"parent": "disabled", "subprocess": "disabled"}


def test_children_can_be_left_without_it(tmp_path):
    states = _run(tmp_path, "mp.spawn", "subprocess", TORCH_OVERLAY_CHILDREN="0")
    assert states == {"parent": "applied", "mp.spawn": None, "subprocess": None}
