"""Reach: how often this process ran the code each fix changed (``TORCH_OVERLAY_REACH=1``).

Only the code objects of the functions a fix's hunks touch are watched (``ModuleCode.changed``,
a late swap's new code), never the rest of a patched module. Python 3.12+ turns ``sys.monitoring``'s
PY_START event on for those code objects alone: other code runs exactly as without it. Python 3.11
has no per-code event: the patched code is compiled with a counting statement at the start of each
changed function (engine/reach_counter.py), so only those functions pay. Code compiled without one
(reach started after the code was compiled, a swap the counted code could not pair) falls back to a
profile function (``sys.setprofile``, ``threading.setprofile``, installed when such code is first
watched), called for every Python and C call of the threads Python starts, which returns at once
unless the frame's code is watched; C++ threads that run Python (autograd's device threads) are not
seen by it. A run made while an import executes a module's code is not counted (``made_by_import``).
"""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
import threading
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TYPE_CHECKING

from .reach_counter import made_by_import

if TYPE_CHECKING:
    from .components import Component, Entry
    from .modcode import ModuleCode

__all__ = ["DUMP_DIR", "dump", "Reach", "read_dumps"]

# The name our sys.monitoring tool is registered under.
_TOOL_NAME = "torch_overlay reach"
# Set by compare's pytest plugin (tools/reach_plugin.py) around each test: a process that ends
# while it is set (a test's ranks) writes its counts there, one file per process.
DUMP_DIR = "TORCH_OVERLAY_REACH_DIR"


class Reach:
    """The watched code objects and how often each ran; per fix on demand (``entries``: the
    overlay's entries so far, for :meth:`report`)."""

    def __init__(self, entries: Callable[[], list[Entry]]) -> None:
        self._entries = entries
        self._fixes: dict[int, tuple[str, ...]] = {}  # id(code) -> the fixes that changed it
        self._codes: dict[int, types.CodeType] = {}  # holds each watched code: its id stays its own
        self._calls: dict[int, int] = {}  # id(code) -> runs; the hot path's only data
        # Python 3.11's counted code (engine/reach_counter.py): id(code) -> its key in ``runs``, and
        # each key's runs when it was first watched (the counter is the process's, not this object's).
        self._keys: dict[int, str] = {}
        self._since: dict[str, int] = {}
        self._frozen: dict[str, int] | None = None  # the counters' runs when stopped
        self._lock = threading.Lock()
        self._backend: _Profile | _Monitoring | None = None
        # Under compare's reach plugin, a rank that runs test after test (engine/reach_ranks.py): the
        # counts at its last dump, and the test that dump was for.
        self._dumped: dict[str, int] = {}
        self._test: str | None = None
        # A forked child counts its own runs (its dump would repeat the parent's otherwise).
        os.register_at_fork(after_in_child=self._forget_runs)
        atexit.register(self._dump)

    def _forget_runs(self) -> None:
        for key in self._calls:
            self._calls[key] = 0
        self._since.update(self._runs())
        self._dumped, self._test = {}, None

    def _runs(self) -> dict[str, int]:
        """The watched counters' runs (of counted code) so far."""
        if self._frozen is not None:
            return dict(self._frozen)
        if not self._since:
            return {}
        from .reach_counter import runs

        return {key: runs[key] for key in self._since}

    def watch(self, fix: str, codes: Iterable[types.CodeType]) -> None:
        """Count the runs of ``codes`` for ``fix`` from now on."""
        with self._lock:
            for code in codes:
                key = id(code)
                fixes = self._fixes.get(key, ())
                if fix in fixes:
                    continue
                self._fixes[key] = (*fixes, fix)
                if key in self._codes:
                    continue
                self._codes[key] = code
                counter = _counter_of(code)
                if counter is not None:
                    self._keys[key] = counter
                    if counter not in self._since:
                        self._since[counter] = self._runs_now(counter)
                    continue
                self._calls[key] = 0
                if self._backend is None:
                    self._backend = _Monitoring(self._calls) if hasattr(sys, "monitoring") else _Profile(self._calls)
                self._backend.add(code)

    def watch_live(self, components: Iterable[Component]) -> Reach:
        """Watch what already runs patched code: modules executed, functions swapped. Set as the
        overlay's ``reach``, it then watches the code of each patch it applies later."""
        for component in components:
            for name, plan in component.modules.items():
                if plan.code is not None and name in sys.modules:
                    self.watch_module(plan.code)
        self.watch_swaps(self._entries())
        return self

    def watch_module(self, code: ModuleCode) -> None:
        """The functions of a module's patched code that each patch changed (before it executes)."""
        for pid, codes in code.changed_functions().items():
            self.watch(pid, codes)

    def watch_swaps(self, entries: list[Entry]) -> None:
        """The live code of each function a late swap of ``entries`` (in series order) changed.

        A later patch of a module swaps the functions an earlier one changed too (each plan goes
        from the code as imported to the text after its patch): it changed those only if its code
        differs from the earlier one's.
        """
        if not any(e.plans for e in entries):
            return
        from .codeswap import same_code

        before: dict[tuple[str, str], types.CodeType] = {}  # (module, qualname) -> code before this patch
        for entry in entries:
            changed = []
            for plan in entry.plans:
                for fn, old, new in plan.swaps:
                    key = (plan.module.__name__, new.co_qualname)
                    # Functions only: a swap never runs a class body or module-level code again.
                    if new.co_flags & 0x0001 and not same_code(before.setdefault(key, old), new):
                        changed.append(fn.__code__)
                    before[key] = new
            self.watch(entry.id, changed)

    def report(self) -> list[dict[str, Any]]:
        """Per fix whose code runs (applied, or pending with some of its modules already running it):
        ``id``, ``calls`` (runs of its changed functions; None when it changed no function, only
        definitions) and ``silent`` (its ``Silent:`` field)."""
        from .._state import PatchState
        from .job_lines import silent_note

        counts, watched = self.counts(), self.watched()
        return [
            {"id": e.id, "calls": counts.get(e.id, 0) if e.id in watched else None, "silent": silent_note(e)}
            for e in self._entries()
            if e.state == PatchState.APPLIED or (e.state == PatchState.PENDING and e.live)
        ]

    def _dump(self) -> None:
        """At exit, under compare's reach plugin: this process's counts, for the test that started it
        (or, after :meth:`dump_test`, those since, for the last test it ran)."""
        self.dump_test(self._test)

    def dump_test(self, test: str | None) -> None:
        """Under compare's reach plugin: this process's counts since its last dump, for ``test`` (a
        unittest id, ``module.Class.method``; None: the test that started the process)."""
        folder = os.environ.get("TORCH_OVERLAY_REACH_DIR")  # DUMP_DIR
        if not folder:
            return
        counts = self.counts()
        since, self._dumped, self._test = self._dumped, counts, test
        dump({fix: n - since.get(fix, 0) for fix, n in counts.items()}, folder, test)

    def watched(self) -> set[str]:
        """The fixes with at least one watched code object."""
        with self._lock:
            return {fix for fixes in self._fixes.values() for fix in fixes}

    def counts(self) -> dict[str, int]:
        """Fix id -> how many times its changed code ran so far (a call of each function it changed)."""
        with self._lock:
            calls = dict(self._calls)
            fixes = dict(self._fixes)
            keys = dict(self._keys)
            since = dict(self._since)
            counted = self._runs()
        out: dict[str, int] = {}
        for key, n in calls.items():
            for fix in fixes[key]:
                out[fix] = out.get(fix, 0) + n
        # A counter shared by several watched codes (defs of one qualname) is added once per fix.
        for counter, fix in {(counter, fix) for key, counter in keys.items() for fix in fixes[key]}:
            out[fix] = out.get(fix, 0) + counted.get(counter, since[counter]) - since[counter]
        return out

    def stop(self) -> None:
        """Stop counting (the counts so far stay)."""
        with self._lock:
            self._frozen = self._runs()
            if self._backend is not None:
                self._backend.stop()

    @staticmethod
    def _runs_now(counter: str) -> int:
        from .reach_counter import runs

        return runs[counter]


def dump(counts: dict[str, int], folder: str, test: str | None = None) -> None:
    """Write ``counts`` (those run) for ``test`` into ``folder`` as a file of its own, whole or not at all."""
    import json

    ran = {fix: n for fix, n in counts.items() if n}
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{os.getpid()}-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"test": test, "counts": ran}, f)
        os.replace(tmp, tmp.removesuffix(".tmp") + ".json")
    except OSError:  # at exit, the test that made the folder may be gone: nothing to tell it
        pass


def read_dumps(folder: Path, read: set[Path]) -> list[tuple[str | None, dict[str, int]]]:
    """The dumps in ``folder`` not in ``read`` (which gets them), each as (its test, its counts)."""
    import json

    out: list[tuple[str | None, dict[str, int]]] = []
    for path in sorted(folder.glob("*.json")):
        if path in read:
            continue
        read.add(path)
        try:
            data = json.loads(path.read_text())
            test = data["test"]
            out.append((test if isinstance(test, str) else None, {fix: int(n) for fix, n in data["counts"].items()}))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def _counter_of(code: types.CodeType) -> str | None:
    """The key of the counter compiled into ``code`` (Python 3.11, engine/reach_counter.py), or None."""
    if sys.version_info >= (3, 12) or "__torch_overlay_runs__" not in code.co_names:
        return None
    from .reach_counter import counted_key

    return counted_key(code)


class _Profile:
    """Python 3.11: a profile function on this thread and on the threads started after it."""

    def __init__(self, calls: dict[int, int]) -> None:
        def on_event(frame: types.FrameType, event: str, arg: object) -> None:
            # Every call and return of the thread comes here: as little as possible before leaving.
            if event == "call":
                key = id(frame.f_code)
                if key in calls and not made_by_import(frame):
                    calls[key] += 1

        self._hook = on_event
        sys.setprofile(on_event)
        threading.setprofile(on_event)

    def add(self, code: types.CodeType) -> None:
        """Nothing to do: the profile function looks ``code`` up in ``calls``."""

    def stop(self) -> None:
        if sys.getprofile() is self._hook:
            sys.setprofile(None)
        threading.setprofile(None)


class _Monitoring:
    """Python 3.12+: PY_START turned on for each watched code object alone."""

    def __init__(self, calls: dict[int, int]) -> None:
        monitoring = sys.monitoring  # type: ignore[attr-defined]
        self._monitoring = monitoring
        self._tool = None
        for tool in (4, 3, 5, 1):  # the ids no standard tool claims first (0 debugger, 2 profiler)
            if monitoring.get_tool(tool) is None:
                monitoring.use_tool_id(tool, _TOOL_NAME)
                self._tool = tool
                break

        def on_start(code: types.CodeType, offset: int) -> None:
            key = id(code)
            if key in calls and not made_by_import(sys._getframe(1)):
                calls[key] += 1

        if self._tool is not None:
            monitoring.register_callback(self._tool, monitoring.events.PY_START, on_start)

    def add(self, code: types.CodeType) -> None:
        if self._tool is not None:
            self._monitoring.set_local_events(self._tool, code, self._monitoring.events.PY_START)

    def stop(self) -> None:
        if self._tool is not None:
            self._monitoring.register_callback(self._tool, self._monitoring.events.PY_START, None)
            self._monitoring.free_tool_id(self._tool)
            self._tool = None
