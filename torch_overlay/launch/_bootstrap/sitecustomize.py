"""Put first on ``PYTHONPATH`` by ``python -m torch_overlay run``: every Python process of the job
(torchrun workers, spawn and forkserver children, DataLoader workers) imports torch_overlay before
its own code runs. The ``sitecustomize`` this one shadows, if any, runs afterwards.
"""

import os
import sys


def _chain_to_the_shadowed_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    import torch_overlay  # noqa: F401
except Exception as exc:  # noqa: BLE001 - the job runs, unpatched, and says why
    if os.environ.get("TORCH_OVERLAY_STRICT", "").strip().lower() in ("1", "true", "yes", "on"):
        raise
    sys.stderr.write(
        f"torch_overlay launcher: {sys.executable} (pid {os.getpid()}) could not import torch_overlay "
        f"({type(exc).__name__}: {exc}); this process runs WITHOUT the overlay's fixes\n"
    )
else:
    from torch_overlay.launch import hooks

    hooks.install()

_chain_to_the_shadowed_sitecustomize()
