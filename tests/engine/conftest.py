import pytest

from torch_overlay._config import Config
from torch_overlay.engine.caches import record

from ._fixtures import Sandbox


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    # Its modules and patches are written just now: a decision over them, and the series index, are
    # kept at once (the rule that keeps none over a file written within the racy window has its
    # own tests, in test_decision_record.py and test_series_index.py).
    monkeypatch.setattr(record, "RACY_NS", 0)
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
