"""Strict mode raises the warnings the series adds to torch (``engine/strict_warnings.py``).

The filters are checked on their own, then on the real warning: a one-process FSDP2 job (fake
process group) whose loss drops a module's output, run with and without ``TORCH_OVERLAY_STRICT=1``.
"""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from torch_overlay.engine import strict_warnings

REPO = Path(__file__).resolve().parents[2]
FSDP_STATE = "torch.distributed.fsdp._fully_shard._fsdp_state"
UNUSED = (
    "FSDP module 'b' ran forward, but this rank's backward does not reach its outputs ... "
    "Call `model.set_reduce_scatter_unused_params(True)` on the root FSDP module"
)

# Rank 0 of a fake 2-rank group: `b` runs forward, the loss reads only `a`'s output.
JOB = """
import os
import warnings
import torch_overlay
import torch, torch.distributed as dist, torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

class TwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
    def forward(self, x):
        h = self.a(x)
        return h, self.b(h)

dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
model = TwoOutputs()
fully_shard(model.a), fully_shard(model.b), fully_shard(model)
with warnings.catch_warnings(record=True) as caught:
    if not os.environ.get("TORCH_OVERLAY_STRICT"):
        warnings.simplefilter("always")  # a filter in front of strict mode's would override it
    for _ in range(2):
        model(torch.randn(2, 4))[0].sum().backward()
print([str(w.message) for w in caught if "set_reduce_scatter_unused_params" in str(w.message)])
"""


def _warn(message: str, module: str) -> None:
    warnings.warn_explicit(message, UserWarning, "f.py", 1, module=module)


def test_the_filter_raises_only_the_patch_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        strict_warnings.install()
        with pytest.raises(UserWarning, match="'b'"):
            _warn(UNUSED, FSDP_STATE)
        with warnings.catch_warnings(record=True) as caught:
            _warn(UNUSED, "user_code")  # the same text from elsewhere
            _warn("FSDP module 'b' something else", FSDP_STATE)
        assert len(caught) == 2


def _job(**env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY") or k == "TORCH_OVERLAY_CACHE_DIR"}
    full.update(PYTHONPATH=str(REPO), **env)
    return subprocess.run([sys.executable, "-c", JOB], env=full, capture_output=True, text=True, timeout=600)


def test_strict_mode_raises_where_fsdp_warns():
    proc = _job()
    assert proc.returncode == 0, proc.stderr[-3000:]
    (message,) = eval(proc.stdout.strip().splitlines()[-1])  # once, not every step
    assert message.startswith("FSDP module 'b' ") and "set_reduce_scatter_unused_params(True)" in message
    strict = _job(TORCH_OVERLAY_STRICT="1")
    assert strict.returncode != 0
    assert "UserWarning: FSDP module 'b' " in strict.stderr, strict.stderr[-3000:]
