"""The build-time forms of the patch series, for ``./build.sh apply|wheel|stage``.

- ``apply``: apply the series to a PyTorch git checkout (or undo it, or only check it).
- ``wheel``: rebuild a torch wheel with the series applied to its Python files.
- ``stage``: one upstream-style commit per patch, with its test and PR body.

Every verb decides a patch's state with the runtime overlay's rules (:mod:`torch_overlay.series.plan`), so a patched
checkout, a rebuilt wheel and ``import torch_overlay`` run the same source. ``import torch_overlay``
does not import this package.
"""

from __future__ import annotations

__all__ = ["BuildError"]


class BuildError(Exception):
    """A verb refused to run. The message says why; nothing was changed."""
