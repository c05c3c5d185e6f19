"""What a patch changed, seen from a function: ``torch_overlay.is_patched`` and ``get_original``.

Finds the code objects behind a function, method or class, and rebuilds a function with other code.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:
    from .components import Component, Entry

__all__ = ["codes_of", "find_code", "get_original", "installed_name", "is_patched", "patched_codes", "with_code"]


def codes_of(obj: object) -> list[types.CodeType]:
    """The code of a function or method; of a class, the code of its methods and properties."""
    obj = getattr(obj, "__func__", obj)
    if isinstance(obj, type):
        out = []
        for value in vars(obj).values():
            value = getattr(value, "__func__", value)
            for part in (value, getattr(value, "fget", None), getattr(value, "fset", None)):
                code = getattr(part, "__code__", None)
                if code is not None:
                    out.append(code)
        return out
    code = getattr(obj, "__code__", None)
    return [code] if code is not None else []


def find_code(code: types.CodeType, qualname: str) -> types.CodeType | None:
    """The code object named ``qualname`` nested in ``code`` (depth first), if any."""
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_qualname == qualname:
                return const
            found = find_code(const, qualname)
            if found is not None:
                return found
    return None


def with_code(fn: Any, code: types.CodeType) -> types.FunctionType:
    """A copy of function ``fn`` (same globals, defaults, closure and attributes) running ``code``."""
    copy = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__dict__.update(fn.__dict__)
    copy.__qualname__ = fn.__qualname__
    return copy


def installed_name(file: Path) -> str:
    """The installed file under a name of its own (``dir/./file.py``) for code compiled from it.

    linecache holds the patched text under the plain name (``inspect.getsource(module)`` shows the
    module as it runs); code under this name reads the file on disk, as torch ships it.
    """
    return os.path.join(os.path.dirname(file), ".", os.path.basename(file))


def patched_codes(
    entries: list[Entry], components: Iterable[Component]
) -> dict[int, tuple[types.CodeType, Entry | None, str]]:
    """id(code) -> (code, entry of a swap or None, module) for every code object a patch changed."""
    out: dict[int, tuple[types.CodeType, Entry | None, str]] = {}
    for entry in entries:
        for plan in entry.plans:
            for _, _, new in plan.swaps:
                out[id(new)] = (new, entry, plan.module.__name__)
    for component in components:
        for name, module_plan in component.modules.items():
            if module_plan.code is not None and name in sys.modules:
                for code in module_plan.code.patched_codes():
                    out[id(code)] = (code, None, name)
    return out


def is_patched(obj: object, entries: list[Entry], by_module: dict[str, Component]) -> bool:
    """Whether ``obj`` (a function, method or class) runs code a patch changed."""
    codes = patched_codes(entries, _unique(by_module))
    if isinstance(obj, type):
        component = by_module.get(obj.__module__)
        plan = component.modules.get(obj.__module__) if component else None
        if plan is not None and plan.code is not None:
            if any(obj.__qualname__ in names for names in plan.code.changed.values()):
                return True
    return any(id(c) in codes for c in codes_of(obj))


def get_original(obj: Any, entries: list[Entry], by_module: dict[str, Component]) -> Any:
    """The function as torch ships it: ``obj`` itself when no patch changed it."""
    fn = getattr(obj, "__func__", obj)
    code = getattr(fn, "__code__", None)
    if code is None:
        return obj
    found = patched_codes(entries, _unique(by_module)).get(id(code))
    if found is None:
        return obj
    _, entry, module = found
    original: types.CodeType | None = None
    if entry is not None:
        original = next(old for plan in entry.plans for f, old, new in plan.swaps if new is code)
    else:
        plan = by_module[module].modules[module]
        unpatched = compile(plan.base, installed_name(plan.file), "exec", dont_inherit=True)
        original = find_code(unpatched, code.co_qualname)
    if original is None or original.co_freevars != code.co_freevars:
        raise ValueError(f"{code.co_qualname}: the patch added it; torch has no original")
    return with_code(fn, original)


def _unique(by_module: dict[str, Component]) -> list[Component]:
    return list({id(c): c for c in by_module.values()}.values())
