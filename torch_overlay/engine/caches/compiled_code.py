"""Compiled code kept for the next process: a patched module's (``engine/modcode.py``) and a late
swap's (``engine/codeswap.py``). Parsing and compiling is what a cold process pays for; a warm one
loads the code. Each entry's key names the module, its file and the texts it was compiled from; the
callers also check that the code loaded was compiled for that file and those patches.
"""

from __future__ import annotations

import types

from .record import Record

__all__ = ["COUNTED_MODULE_CODE", "COUNTED_SWAP_CODE", "MODULE_CODE", "MODULE_LINES", "SWAP_CODE"]


def _is_module_code(value: object) -> bool:
    """The shape of :func:`~..modcode.compile_module`'s entry: its code, what each patch changed
    (patch id -> qualnames) and the size of its text."""
    return (
        isinstance(value, tuple)
        and len(value) == 3
        and isinstance(value[0], types.CodeType)
        and isinstance(value[1], dict)
        and all(isinstance(k, str) and isinstance(v, list) for k, v in value[1].items())
        and isinstance(value[2], int)
    )


def _is_lines(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(line, str) for line in value)


# A patched module's code: (code, changed, size). Version 2: the code carries the installed file's
# name (version 1 added "[torch_overlay]" to it). Version 3: its lines are an entry of their own.
MODULE_CODE = Record("module code", 3, _is_module_code)

# A patched module's text, split into lines as linecache holds them, under the parts of its
# MODULE_CODE key: read when a traceback or ``inspect`` first asks for it, not at every ``import
# torch`` (unmarshalling and checking distributed_c10d.py's lines was most of that entry's cost).
MODULE_LINES = Record("module lines", 1, _is_lines)


def _is_compiled_patch(value: object) -> bool:
    """The shape :func:`~..codeswap._compile_patched` returns (what a cache entry must unmarshal to)."""
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], types.CodeType)):
        return False
    added = value[1]
    return isinstance(added, list) and all(
        isinstance(a, tuple)
        and len(a) == 3
        and isinstance(a[0], types.CodeType)
        and isinstance(a[1], list)
        and isinstance(a[2], int)
        for a in added
    )


# A late swap's code: (the new module code, the statements it adds).
SWAP_CODE = Record("swap code", 1, _is_compiled_patch)

# The same, compiled with a counter at the start of each changed function (reach on Python 3.11,
# engine/reach_counter.py): kinds of their own, so counted and plain code never stand in for each other.
COUNTED_MODULE_CODE = Record("counted module code", 2, _is_module_code)
COUNTED_SWAP_CODE = Record("counted swap code", 1, _is_compiled_patch)
