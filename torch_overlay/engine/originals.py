"""Find the code objects behind a function, method or class, and rebuild a function with other code.

Used by ``torch_overlay.is_patched`` and ``torch_overlay.get_original``.
"""

from __future__ import annotations

import types
from typing import Any

__all__ = ["codes_of", "find_code", "with_code"]


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
