import pytest

from torch_overlay._config import Config

from ._fixtures import Sandbox


@pytest.fixture
def sandbox(tmp_path):
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
