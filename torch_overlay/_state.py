"""The words every part of the overlay uses for what a patch does: its state, its targets, its row.

Plain classes, not dataclasses: this module is on the path of every ``import torch`` under the
overlay, and ``@dataclass`` compiles each generated method at import (about 3 M instructions per
class, i.e. more than the rest of the module). ``tests/test_records.py`` holds them to the
dataclass behaviour they replace (fields, equality, hashing, repr).
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["Mode", "OverlayError", "OverlayWarning", "PatchState", "PatchStatus", "Target"]


class OverlayError(RuntimeError):
    """Raised instead of a warning under ``TORCH_OVERLAY_STRICT=1``."""


class OverlayWarning(UserWarning):
    """A patch drifted or failed, or a switch or the series could not be read."""


class _Words(type):
    """The class of a set of named strings, with the ``enum.StrEnum`` surface the overlay uses:
    ``Cls.NAME``, ``Cls("value")``, iteration in definition order, members that are their value
    (``==``, ``str()``, ``hash``, JSON) with ``.name``, ``.value`` and an enum-like repr, pickled
    by value. Not ``enum``: making the two classes below with it cost 1.6 M instructions at every
    ``import torch`` (``tests/test_records.py`` holds them to the StrEnum behaviour)."""

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, object]) -> _Words:
        words = {k: v for k, v in namespace.items() if k.isupper() and type(v) is str}
        cls = super().__new__(mcs, name, bases, {k: v for k, v in namespace.items() if k not in words})
        members = []
        for key, value in words.items():
            member: _Word = str.__new__(cls, value)  # type: ignore[arg-type]  # cls derives from _Word
            member.name = key
            type.__setattr__(cls, key, member)
            members.append(member)
        type.__setattr__(cls, "_members", tuple(members))
        return cls

    def __call__(cls, value: object) -> _Word:
        for member in cls._members:  # type: ignore[attr-defined]
            if member == value:
                return member
        raise ValueError(f"{value!r} is not a valid {cls.__name__}")

    def __iter__(cls) -> Iterator[_Word]:
        return iter(cls._members)  # type: ignore[attr-defined]

    def __len__(cls) -> int:
        return len(cls._members)  # type: ignore[attr-defined]

    def __setattr__(cls, name: str, value: object) -> None:
        raise AttributeError(f"cannot reassign member {name!r} of {cls.__name__}")


class _Word(str):
    name: str

    @property
    def value(self) -> str:
        return str.__str__(self)

    def __str__(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {str.__repr__(self)}>"

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return type(self), (str.__str__(self),)

    def __copy__(self) -> _Word:
        return self

    def __deepcopy__(self, memo: object) -> _Word:
        return self


TYPE_CHECKING = False  # mypy reads it as True (no `typing` import on the path of `import torch`)
if TYPE_CHECKING:
    # mypy's view: members are instances of their class (``PatchState.APPLIED: PatchState``, not the
    # ``str`` written in the class body), ``Cls(value)`` and iteration give members, as for an enum.
    from enum import EnumMeta as _WordsView
else:
    _WordsView = _Words


class PatchState(_Word, metaclass=_WordsView):
    APPLIED = "applied"  # the patched code is live (the build tools: the diff applies)
    UPSTREAM = "upstream"  # torch already has the change
    DRIFT = "drift"  # neither the diff nor its reverse fits
    NOT_NEEDED = "not needed"  # the bug came later than this release (before `Introduced`)
    DISABLED = "disabled"  # switched off (or reverted)
    PENDING = "pending"  # waiting for its modules to be imported
    SOURCE_ONLY = "source only"  # the fix is in compiled sources (C++): a source build carries it
    FAILED = "failed"  # anything unexpected; the reason says what


class Mode(_Word, metaclass=_WordsView):
    """How an applied patch reached its modules."""

    AT_IMPORT = "at import"  # the module executed the patched source
    SWAPPED = "swapped"  # the module was imported first; changed functions got the patched code
    MIXED = "at import, swapped"


class Target:
    """A file a patch changes: its path in torch's tree and the module it defines (immutable)."""

    __slots__ = ("path", "module")
    path: str  # "torch/distributed/tensor/_api.py"
    module: str  # "torch.distributed.tensor._api" ("" for a compiled source: "torch/csrc/...cpp")

    def __init__(self, path: str, module: str) -> None:
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "module", module)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Target is immutable: cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Target is immutable: cannot delete field {name!r}")

    def __repr__(self) -> str:
        return f"Target(path={self.path!r}, module={self.module!r})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.path, self.module) == (other.path, other.module)

    def __hash__(self) -> int:
        return hash((self.path, self.module))

    def __reduce__(self) -> tuple[type[Target], tuple[str, str]]:
        return (Target, (self.path, self.module))

    @classmethod
    def from_path(cls, path: str) -> Target:
        if not path.endswith(".py"):
            return cls(path, "")
        parts = path.removesuffix(".py").split("/")
        if parts[-1] == "__init__":
            parts.pop()
        return cls(path, ".".join(parts))


class PatchStatus:
    """One patch's row: what ``torch_overlay.status()`` gives and ``status`` prints."""

    FIELDS = ("id", "title", "bug", "targets", "state", "reason", "variant", "mode", "late")

    def __init__(
        self,
        id: str,
        title: str,
        bug: str,
        targets: tuple[Target, ...],
        state: PatchState,
        reason: str,
        variant: str = "",  # file name of the variant that applied / matched
        mode: str = "",  # a Mode when applied
        late: str = "",  # failed because this module was imported before the overlay
    ) -> None:
        self.id = id
        self.title = title
        self.bug = bug
        self.targets = targets
        self.state = state
        self.reason = reason
        self.variant = variant
        self.mode = mode
        self.late = late

    def __repr__(self) -> str:
        return f"PatchStatus({', '.join(f'{k}={getattr(self, k)!r}' for k in self.FIELDS)})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it replaces

    def replace(self, **changes: object) -> PatchStatus:
        """A copy with ``changes`` (``dataclasses.replace``'s job)."""
        return PatchStatus(**{**{k: getattr(self, k) for k in self.FIELDS}, **changes})

    def as_dict(self) -> dict[str, object]:
        out = {k: getattr(self, k) for k in self.FIELDS}
        out["targets"] = [t.path for t in self.targets]
        out["state"] = str(self.state)
        return out
