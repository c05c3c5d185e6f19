import pytest

from torch_overlay._config import Config
from torch_overlay.engine import decision_cache

from ._fixtures import Sandbox


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    # Its modules are written just now: a decision over them is kept at once (the rule that keeps
    # none over a file written within the racy window has its own test, in test_decision_cache.py).
    monkeypatch.setattr(decision_cache, "RACY_NS", 0)
    box = Sandbox(tmp_path)
    yield box
    box.close()


@pytest.fixture
def config(sandbox):
    def make(**kw):
        base = dict(enabled=True, disabled_ids=frozenset(), strict=False, patches_dir=sandbox.patches)
        base.update(kw)
        return Config(**base)

    return make
