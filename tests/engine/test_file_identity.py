"""Patched code carries its module's file name: torch tells its own frames from the user's by it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Non-strict export of a module whose forward calls max() on tensors: symbolic_shapes finds the
# user's frame by skipping the files of uninteresting_files() (inspect.getfile of its modules).
# When the patched symbolic_shapes.py (inductor-unbacked-split-rebind on 2.11-2.13) ran under
# another file name, its frames were taken for the user's and export stopped with "We found a
# fake tensor in the exported program constant's list" (upstream's test_export_max_nonstrict).
JOB = """
import json, sys, torch_overlay, torch
import torch.fx.experimental.symbolic_shapes as symbolic_shapes

class MaxTensors(torch.nn.Module):
    def forward(self, x):
        return torch.ones(max(x, x)) + torch.ones(min(x, x))

ep = torch.export.export(MaxTensors(), (torch.tensor(4),), strict=False)
# The function the fix changes, where the installed torch needs it (2.11-2.13); else unpatched.
fn = symbolic_shapes.rebind_unbacked
print(json.dumps({"out": ep.module()(torch.tensor(4)).tolist(), "patched": torch_overlay.is_patched(fn),
                  "file": fn.__code__.co_filename, "module_file": symbolic_shapes.__file__}))
"""


def test_patched_modules_keep_their_file_name_and_export_finds_the_user_frame():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY_") or k == "TORCH_OVERLAY_CACHE_DIR"}
    env["PYTHONPATH"] = str(REPO)
    env["TORCH_OVERLAY_QUIET"] = "1"
    proc = subprocess.run([sys.executable, "-c", JOB], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["out"] == [2.0] * 4
    assert report["file"] == report["module_file"]
    if torch_needs_rebind_fix():
        assert report["patched"]


def torch_needs_rebind_fix() -> bool:
    import torch

    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 14)
