"""Keep torch's caches honest after code changed under them."""

from __future__ import annotations

import sys

__all__ = ["clear_dtensor_caches", "set_compile_cache_salt"]

_DTENSOR_PREFIX = "torch.distributed.tensor."
_user_tag: str | None = None


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


COMPILER_CONFIG = "torch.compiler.config"


def set_compile_cache_salt(salt: str) -> bool:
    """Fold ``salt`` into ``torch.compiler.config.cache_key_tag``; False if not loaded yet.

    The tag is part of the FX graph cache and AOTAutogradCache keys, so a graph compiled before a
    patch was applied (or by a process without it) is never reused by a process that has it.
    The config module is not imported here: a patch may be applied while torch itself is still
    initializing, and nothing can be compiled before the config is loaded anyway.
    """
    global _user_tag
    cconfig = sys.modules.get(COMPILER_CONFIG)
    if cconfig is None or getattr(getattr(cconfig, "__spec__", None), "_initializing", False):
        return False
    if _user_tag is None:
        _user_tag = cconfig.cache_key_tag
    cconfig.cache_key_tag = "|".join(p for p in (_user_tag, salt) if p)
    return True
