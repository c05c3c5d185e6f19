"""Keep torch's caches honest after code changed under them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from .importhook import ImportHook
from .once_per_job import warn

if TYPE_CHECKING:
    from .components import Entry

__all__ = ["CompileCacheSalt", "clear_dtensor_caches", "refresh_after_change", "touches_dtensor"]

_DTENSOR_PREFIX = "torch.distributed.tensor."
COMPILER_CONFIG = "torch.compiler.config"


def refresh_after_change(
    modules: list[str], entries: list[Entry], salt: Callable[[], CompileCacheSalt], strict: bool
) -> None:
    """After ``modules`` changed code: drop DTensor's sharding caches if one of them is DTensor's,
    and salt the compile caches with the live patches of ``entries``. Runs inside an import: a
    failure is a warning (raised in strict mode), never a broken import."""
    try:
        if touches_dtensor(modules):
            clear_dtensor_caches()
        live = [(e.id, e.variant) for e in entries if e.live and e.variant is not None]
        salt().set(",".join(f"torch_overlay:{pid}@{variant.digest[:12]}" for pid, variant in live))
    except Exception as exc:  # noqa: BLE001 - runs inside an import: never break it
        if strict:
            raise
        warn(f"torch_overlay: could not refresh torch's caches after a patch ({type(exc).__name__}: {exc})")


def touches_dtensor(modules: list[str]) -> bool:
    return any(m.startswith(_DTENSOR_PREFIX) for m in modules)


def clear_dtensor_caches() -> None:
    """Drop memoized sharding propagation (the Python LRU and the C++ fast path).

    Same steps as ``torch.distributed.tensor.debug._clear_sharding_prop_cache``, without importing
    that package, which may still be initializing when a strategy module is patched.
    """
    api = sys.modules.get("torch.distributed.tensor._api")
    dtensor = getattr(api, "DTensor", None)
    if dtensor is None:
        return  # DTensor not defined yet: nothing has been propagated, so nothing is cached
    propagator = dtensor._op_dispatcher.sharding_propagator
    clear = getattr(propagator.propagate_op_sharding, "cache_clear", None)
    if clear is not None:
        clear()
    torch_c = sys.modules["torch"]._C
    clear_fast_path = getattr(torch_c, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_fast_path is not None:
        clear_fast_path()


class CompileCacheSalt:
    """Fold the applied patches into ``torch.compiler.config.cache_key_tag``.

    The tag is part of the FX graph cache and AOTAutogradCache keys, so a graph compiled before a
    patch was applied (or by a process without it) is never reused by a process that has it. The
    user's own tag is kept: the salt is appended to it, and a tag the user set since is taken as the
    new user part. The config module is never imported here (a patch may apply while torch is
    still initializing); the salt is written when it is.
    """

    def __init__(self, hook: ImportHook) -> None:
        self._hook = hook
        self._salt = ""
        self._written: str | None = None  # the tag as we last wrote it
        self._user = ""
        self._waiting = False

    def set(self, salt: str) -> None:
        self._salt = salt
        if not self._write() and not self._waiting:
            self._waiting = True
            self._hook.on_import(COMPILER_CONFIG, lambda _: self._write())

    def _write(self) -> bool:
        cconfig = sys.modules.get(COMPILER_CONFIG)
        if cconfig is None or getattr(getattr(cconfig, "__spec__", None), "_initializing", False):
            return False
        current = getattr(cconfig, "cache_key_tag", None)
        if current is None:
            return True  # a torch without the option: nothing to salt (and nothing to wait for)
        current = current or ""
        if current != self._written:
            # First write, or the user changed the tag: all of it but our old salt is theirs.
            parts = current.split("|") if current else []
            old = set(self._written.split("|")) - set(self._user.split("|")) if self._written else set()
            self._user = "|".join(p for p in parts if p not in old)
        tag = "|".join(p for p in (self._user, self._salt) if p)
        cconfig.cache_key_tag = tag  # type: ignore[attr-defined]  # torch.compiler.config's option
        self._written = tag
        return True
