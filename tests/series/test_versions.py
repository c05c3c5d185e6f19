"""series/versions.py: the installed torch's version, read from its version.py as torch writes it."""

import pytest

from torch_overlay.series.versions import torch_version, version_from_text


@pytest.mark.parametrize(
    "text, version",
    [
        ("__all__ = ['__version__', 'debug']\n__version__ = '2.13.0+cpu'\ndebug = False\n", "2.13.0+cpu"),
        ('__version__: str = "2.15.0+cu132"\n', "2.15.0+cu132"),
        ("__version__ = '2.16.0a0+git1234'  # a source build\n", "2.16.0a0+git1234"),
        ("git_version = '__version__ = 1'\n__version__ = '2.11.0'\n", "2.11.0"),
        ("debug = False\n", None),
        ("__version__ = get_version()\n", None),
    ],
)
def test_version_from_text(text: str, version: str | None) -> None:
    assert version_from_text(text) == version


def test_the_installed_torch_version_is_what_torch_says() -> None:
    import torch

    assert torch_version() == torch.__version__
