"""Environment switches, read once per process."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = [
    "Config",
    "KNOWN_VARIABLES",
    "PATH_SWITCHES",
    "REPORTED",
    "SWITCHES",
    "closest",
    "load_config",
    "parse_switch",
    "switch_path",
    "unknown_ids_problem",
]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_ACCEPTED = f"{'/'.join(_TRUE)} or {'/'.join(_FALSE)} (any case)"
_CHECK_RANKS_MODES = ("warn", "fail")

# What the processes of a job already warned about (see engine/once_per_job.py): set by the overlay itself.
REPORTED = "TORCH_OVERLAY_REPORTED"
# The switches a user sets; any other TORCH_OVERLAY_* variable is warned about as a likely typo.
SWITCHES = (
    "TORCH_OVERLAY",
    "TORCH_OVERLAY_DISABLE",
    "TORCH_OVERLAY_STRICT",
    "TORCH_OVERLAY_PATCHES",
    "TORCH_OVERLAY_CODE_CACHE",
    "TORCH_OVERLAY_CACHE_DIR",
    "TORCH_OVERLAY_CHILDREN",
    "TORCH_OVERLAY_CHECK_RANKS",
    "TORCH_OVERLAY_QUIET",
    "TORCH_OVERLAY_REACH",
)
# Read by build.sh, CI and the tests, not by the overlay: known, so never mistaken for a typo.
_TOOLING = (
    "TORCH_OVERLAY_VENVS",
    "TORCH_OVERLAY_BASE_PYTHON",
    "TORCH_OVERLAY_SKIP_WHEEL_TEST",
    "TORCH_OVERLAY_TEST_LEG",
    "TORCH_OVERLAY_TEST_JOBS",  # pytest processes sharing one suite run (tests/_shards.py)
    "TORCH_OVERLAY_TEST_CLAIMS",  # the folder where they claim test classes and modules
    "TORCH_OVERLAY_REACH_DIR",  # compare's reach plugin: where a test's processes leave their counts
    "TORCH_OVERLAY_TORCH_TREES",  # unpacked wheels of older torch releases, for their error wordings
)
KNOWN_VARIABLES = frozenset((*SWITCHES, *_TOOLING, REPORTED))
# The switches that name a folder: read as an absolute path (a relative one is taken from the
# current folder at import), and handed on so to child processes (launch/env.py), which may start
# in another folder.
PATH_SWITCHES = ("TORCH_OVERLAY_PATCHES", "TORCH_OVERLAY_CACHE_DIR")


def switch_path(value: str) -> str:
    """The absolute path a path-valued switch names (``~`` expanded)."""
    return os.path.abspath(os.path.expanduser(value.strip()))


def default_cache_dir(env: Mapping[str, str]) -> Path:
    """``TORCH_OVERLAY_CACHE_DIR``, else ``$XDG_CACHE_HOME/torch_overlay``, else ``~/.cache/torch_overlay``."""
    if env.get("TORCH_OVERLAY_CACHE_DIR", "").strip():
        return Path(switch_path(env["TORCH_OVERLAY_CACHE_DIR"]))
    xdg = env.get("XDG_CACHE_HOME", "").strip()
    # The XDG spec says a relative path is invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path("~/.cache").expanduser()
    return base / "torch_overlay"


class Config:
    """The switches as read (immutable; a plain class: see ``_state``'s docstring)."""

    enabled: bool
    disabled_ids: frozenset[str]
    strict: bool
    patches_dir: Path
    code_cache: bool
    children: bool
    check_ranks: str
    quiet: bool
    reach: bool
    cache_dir: Path
    problems: tuple[str, ...]

    FIELDS = (
        "enabled",
        "disabled_ids",
        "strict",
        "patches_dir",
        "code_cache",
        "children",
        "check_ranks",
        "quiet",
        "reach",
        "cache_dir",
        "problems",
    )

    def __init__(
        self,
        enabled: bool,  # TORCH_OVERLAY=0 turns the overlay off
        disabled_ids: frozenset[str],  # TORCH_OVERLAY_DISABLE=id,id
        strict: bool,  # TORCH_OVERLAY_STRICT=1 raises instead of warning
        patches_dir: Path,  # TORCH_OVERLAY_PATCHES=dir (default: the shipped series)
        code_cache: bool = True,  # TORCH_OVERLAY_CODE_CACHE=0 compiles patched code in memory only
        children: bool = True,  # TORCH_OVERLAY_CHILDREN=0: child Pythons do not inherit the overlay
        check_ranks: str = "off",  # TORCH_OVERLAY_CHECK_RANKS=warn|fail (1 = warn): see checks/ranks_hook.py
        quiet: bool = False,  # TORCH_OVERLAY_QUIET=1: no job lines (which torch, which fixes); warnings stay
        reach: bool = False,  # TORCH_OVERLAY_REACH=1: count the runs of each fix's changed functions (engine/reach.py)
        cache_dir: Path | None = None,  # None: default_cache_dir(os.environ)
        # One message per switch whose value was not understood (and what was done instead), and per
        # TORCH_OVERLAY_* variable that is no switch. load_config does not warn: the engine reports
        # them once per job (engine/once_per_job.py), or raises under strict.
        problems: tuple[str, ...] = (),
    ) -> None:
        self.__dict__.update(
            enabled=enabled,
            disabled_ids=disabled_ids,
            strict=strict,
            patches_dir=patches_dir,
            code_cache=code_cache,
            children=children,
            check_ranks=check_ranks,
            quiet=quiet,
            reach=reach,
            cache_dir=default_cache_dir(os.environ) if cache_dir is None else cache_dir,
            problems=problems,
        )

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Config is immutable: cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Config is immutable: cannot delete field {name!r}")

    def _values(self) -> tuple[object, ...]:
        return tuple(self.__dict__[k] for k in self.FIELDS)

    def __repr__(self) -> str:
        return f"Config({', '.join(f'{k}={self.__dict__[k]!r}' for k in self.FIELDS)})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def replace(self, **changes: object) -> Config:
        """A copy with ``changes`` (``dataclasses.replace``'s job)."""
        return Config(**{**self.__dict__, **changes})


def parse_switch(name: str, value: str | None, default: bool) -> tuple[bool, str | None]:
    """Read a boolean switch: (value, None), or (False, message) for a value not understood.

    Unset or empty gives ``default``. An unrecognised value reads as off: for the switches on
    by default (``TORCH_OVERLAY``, ``TORCH_OVERLAY_CODE_CACHE``) a value meant to turn them off
    must never leave them on; ``TORCH_OVERLAY_STRICT`` stays off rather than turning warnings
    into exceptions on a value that does not say so.
    """
    if value is None or not value.strip():
        return default, None
    word = value.strip().lower()
    if word in _TRUE:
        return True, None
    if word in _FALSE:
        return False, None
    return False, f"{name}={value!r} is not understood; accepted values: {_ACCEPTED}"


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice ``word`` most likely misspells, if any is close enough."""
    import difflib  # only when something is misspelled: `import torch_overlay` stays light

    matches = difflib.get_close_matches(word, list(choices), n=1)
    return matches[0] if matches else None


def _check_ranks(value: str | None) -> tuple[str, str | None]:
    """``TORCH_OVERLAY_CHECK_RANKS``: off, warn or fail; a value not understood still checks (warn)."""
    word = (value or "").strip().lower()
    if word in _CHECK_RANKS_MODES:
        return word, None
    on, problem = parse_switch("TORCH_OVERLAY_CHECK_RANKS", value, False)
    if problem is None:
        return ("warn" if on else "off"), None
    return "warn", (
        f"TORCH_OVERLAY_CHECK_RANKS={value!r} is not understood; accepted values: "
        f"{', '.join(_CHECK_RANKS_MODES)}, or {_ACCEPTED}; the ranks are checked and a difference is warned about"
    )


def _unknown_variables(env: Mapping[str, str]) -> list[str]:
    prefix = "TORCH_OVERLAY_"
    # Compared without the prefix they all share, which would make any two names look alike.
    suffixes = [n[len(prefix) :] for n in KNOWN_VARIABLES if n.startswith(prefix)]
    out = []
    for name in sorted(n for n in env if n.startswith(prefix) and n not in KNOWN_VARIABLES):
        guess = closest(name[len(prefix) :], suffixes)
        hint = f"did you mean {prefix}{guess}?" if guess else f"the switches are {', '.join(SWITCHES)}"
        out.append(f"{name} is not a torch_overlay variable and is ignored; {hint}")
    return out


def default_patches_dir() -> Path:
    here = Path(__file__).resolve().parent
    # A source checkout keeps the series at the top level; an installed package carries a copy.
    for candidate in (here.parent / "patches", here / "patches"):
        if (candidate / "series").is_file():
            return candidate
    return here.parent / "patches"


def load_config(environ: Mapping[str, str] | None = None) -> Config:
    env = os.environ if environ is None else environ
    problems = []

    def switch(name: str, default: bool, consequence: str) -> bool:
        value, problem = parse_switch(name, env.get(name), default)
        if problem:
            problems.append(f"{problem}; {consequence}")
        return value

    enabled = switch("TORCH_OVERLAY", True, "the overlay is disabled")
    switched_off = not enabled and not problems  # a value that says off, not one misread as off
    strict = switch("TORCH_OVERLAY_STRICT", False, "strict mode stays off")
    code_cache = switch("TORCH_OVERLAY_CODE_CACHE", True, "the code cache is off")
    children = switch("TORCH_OVERLAY_CHILDREN", True, "child processes do not inherit the overlay")
    quiet = switch("TORCH_OVERLAY_QUIET", False, "the job's lines are shown")
    reach = switch("TORCH_OVERLAY_REACH", False, "the fixes' changed code is not watched")
    check_ranks, problem = _check_ranks(env.get("TORCH_OVERLAY_CHECK_RANKS"))
    problems += [problem] if problem else []
    problems += _unknown_variables(env)
    disabled = frozenset(item.strip() for item in env.get("TORCH_OVERLAY_DISABLE", "").split(",") if item.strip())
    if switched_off:
        # TORCH_OVERLAY=0: everything off. Nothing runs that the other switches could change,
        # so a value of theirs is no problem, and strict mode has nothing to stop the job for.
        strict, problems, disabled = False, [], frozenset()
    patches = env.get("TORCH_OVERLAY_PATCHES", "")
    return Config(
        enabled=enabled,
        disabled_ids=disabled,
        strict=strict,
        patches_dir=Path(switch_path(patches)) if patches.strip() else default_patches_dir(),
        code_cache=code_cache,
        children=children,
        check_ranks=check_ranks,
        quiet=quiet,
        reach=reach,
        cache_dir=default_cache_dir(env),
        problems=tuple(problems),
    )


def unknown_ids_problem(disabled: frozenset[str], known: set[str]) -> str | None:
    """The message for ids of ``TORCH_OVERLAY_DISABLE`` that no patch has, each with its closest id."""
    named = []
    for pid in sorted(disabled - known):
        guess = closest(pid, known)
        named.append(f"{pid} (did you mean {guess}?)" if guess else pid)
    if not named:
        return None
    return (
        f"TORCH_OVERLAY_DISABLE names unknown patch id(s) {', '.join(named)}, ignored; "
        "`python -m torch_overlay status` lists the ids"
    )
