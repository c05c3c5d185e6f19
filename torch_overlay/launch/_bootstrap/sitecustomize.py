"""Put first on ``PYTHONPATH`` by ``python -m torch_overlay run``: every Python process of the job
(torchrun workers, spawn and forkserver children, DataLoader workers) imports torch_overlay before
its own code runs.

The ``sitecustomize`` this one shadows, if any, runs first: it is part of the interpreter's setup
(it may put another torch on ``sys.path``), and ``import torch_overlay`` must see the torch that
``import torch`` will load, as it does when a script imports it on its first line. Another
torch_overlay's bootstrap folder on the path (two installs, a launcher of one starting a Python
of the other) is skipped: one overlay is imported, and the user's ``sitecustomize`` runs once.
"""

# torch_overlay-bootstrap-sitecustomize (this line tells other installs' bootstraps to skip this file)

import os
import sys

_MARK = b"torch_overlay-bootstrap-sitecustomize"
_LAYOUT = os.sep + os.path.join("torch_overlay", "launch", "_bootstrap")  # any install, any version
_STRICT = os.environ.get("TORCH_OVERLAY_STRICT", "").strip().lower() in ("1", "true", "yes", "on")


def _is_bootstrap(folder: str) -> bool:
    """Whether the ``sys.path`` entry ``folder`` is a torch_overlay bootstrap folder (of any install)."""
    folder = os.path.abspath(folder or os.curdir)
    if folder.endswith(_LAYOUT):
        return True
    try:
        with open(os.path.join(folder, "sitecustomize.py"), "rb") as file:
            return _MARK in file.read(4096)
    except OSError:
        return False


def _run_the_shadowed_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(p or os.curdir) if isinstance(p, str) else None for p in sys.path]
    # A sitecustomize before this folder would have been imported instead of this one: if there
    # is one, it is running now and ran this one (a shim like this one); look after it only.
    after = sys.path[entries.index(here) + 1 :] if here in entries else sys.path
    path = [p for p in after if not isinstance(p, str) or not _is_bootstrap(p)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _import_the_overlay() -> None:
    try:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            return  # a Python without torch (a tool the job runs): nothing to patch, nothing to say
        import torch_overlay  # noqa: F401
        from torch_overlay.launch import hooks

        hooks.install()
    except Exception as exc:  # noqa: BLE001 - the job runs, unpatched, and says why
        if _STRICT:
            # `site` would print this exception in one line and run the job unpatched: stop here.
            import traceback

            traceback.print_exc()
            sys.stderr.write(
                f"torch_overlay launcher: {sys.executable} (pid {os.getpid()}) could not import torch_overlay "
                f"({type(exc).__name__}: {exc}); TORCH_OVERLAY_STRICT=1, so this process stops (exit status 1)\n"
            )
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(1)
        sys.stderr.write(
            f"torch_overlay launcher: {sys.executable} (pid {os.getpid()}) could not import torch_overlay "
            f"({type(exc).__name__}: {exc}); this process runs WITHOUT the overlay's fixes\n"
        )


try:
    _run_the_shadowed_sitecustomize()
except Exception as exc:  # noqa: BLE001 - what `site` says of a sitecustomize that raises; the overlay still comes
    if sys.flags.verbose:
        sys.excepthook(*sys.exc_info())
    else:
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")
_import_the_overlay()
