"""Check that every rank runs the same torch and the same overlay fixes.

A job whose ranks run different torch builds, or different overlay switches
(``TORCH_OVERLAY_DISABLE`` set on one node, a different patch series), computes
different things on different ranks, and nothing fails. ``check_ranks`` compares
a fingerprint of each rank: its torch build and, for each patch of the series,
its state, the variant chosen and a hash of the patch text.

It costs one all-gather of 32 bytes per rank; only when some fingerprint differs
are the full fingerprints gathered (``all_gather_object``) to say how.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


__all__ = ["PatchFingerprint", "RankDifference", "RankEntry", "RanksReport", "check_ranks"]

_OVERLAY_ID = re.compile(r"^Overlay-Id:\s*(\S+)\s*$", re.M)
# A patch not decided yet on a rank (its target module not imported there) may
# still reach the state the other ranks have.
_UNDECIDED = "pending"

_Kind = Literal["version", "missing", "extra", "state", "variant"]


@dataclasses.dataclass(frozen=True)
class PatchFingerprint:
    """One patch as one rank sees it."""

    state: str
    variant: str  # file name of the variant decided on ("" while pending or disabled)
    variant_hash: str  # sha256 of that variant's text ("" when no variant)
    patch_hash: str  # sha256 of every file of the patch in the series, in series order


@dataclasses.dataclass(frozen=True)
class RankEntry:
    """What one rank runs."""

    rank: int  # global rank
    torch_version: str  # torch.__version__ and, when known, the git commit it was built from
    patches: Mapping[str, PatchFingerprint]  # by Overlay-Id


@dataclasses.dataclass(frozen=True)
class RankDifference:
    """One way a rank differs from the reference rank."""

    rank: int
    kind: _Kind
    patch_id: str  # "" for kind "version"
    expected: str  # the reference rank's value
    found: str  # this rank's value

    def __str__(self) -> str:
        if self.kind == "version":
            return f"rank {self.rank}: torch {self.found} (reference: {self.expected})"
        if self.kind == "missing":
            return f"rank {self.rank}: patch {self.patch_id} missing from its series"
        if self.kind == "extra":
            return f"rank {self.rank}: patch {self.patch_id} not in the reference's series"
        what = "state" if self.kind == "state" else "variant"
        return f"rank {self.rank}: patch {self.patch_id} {what} {self.found} (reference: {self.expected})"


@dataclasses.dataclass(frozen=True)
class RanksReport:
    """Result of :func:`check_ranks`; the same on every rank of the group.

    The reference is the rank with the most common fingerprint (ties: the lowest
    rank); ``differences`` lists how each other rank differs from it.
    """

    entries: tuple[RankEntry, ...]
    reference_rank: int
    differences: tuple[RankDifference, ...]
    num_collectives: int

    @property
    def ok(self) -> bool:
        return not self.differences

    @property
    def differing_ranks(self) -> tuple[int, ...]:
        return tuple(sorted({d.rank for d in self.differences}))

    def __str__(self) -> str:
        ref = next(e for e in self.entries if e.rank == self.reference_rank)
        if self.ok:
            return f"ranks agree ({len(self.entries)} ranks, {len(ref.patches)} patches): torch {ref.torch_version}"
        head = (
            f"ranks differ: {list(self.differing_ranks)} of {len(self.entries)} "
            f"(reference: rank {self.reference_rank}, torch {ref.torch_version}):"
        )
        return "\n  ".join([head, *map(str, self.differences)])


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _series_texts(patches_dir: Path) -> dict[str, list[tuple[str, str]]]:
    """(file name, text) of each file listed in the series, by Overlay-Id."""
    series = patches_dir / "series"
    texts: dict[str, list[tuple[str, str]]] = {}
    if not series.is_file():
        return texts
    for raw in series.read_text(encoding="utf-8").splitlines():
        name = raw.split("#", 1)[0].strip()
        path = patches_dir / name
        if not name or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        match = _OVERLAY_ID.search(text)
        texts.setdefault(match.group(1) if match else name, []).append((name, text))
    return texts


def _local_entry(rank: int) -> RankEntry:
    """This process's fingerprint."""
    import torch

    import torch_overlay
    from torch_overlay._config import load_config

    version = torch.__version__
    git = getattr(torch.version, "git_version", None)
    if git and git != "Unknown":
        version += f" (git {git[:12]})"
    texts = _series_texts(load_config().patches_dir)
    patches = {}
    for row in torch_overlay.status():
        files = texts.get(row.id, [])
        variant_text = next((text for name, text in files if name == row.variant), "")
        patches[row.id] = PatchFingerprint(
            state=row.state,
            variant=row.variant,
            variant_hash=_sha256(variant_text) if variant_text else "",
            patch_hash=_sha256("".join(text for _, text in files)),
        )
    return RankEntry(rank, version, patches)


def _compare(ref: RankEntry, other: RankEntry) -> list[RankDifference]:
    out = []

    def differ(kind: _Kind, patch_id: str, expected: str, found: str) -> None:
        out.append(RankDifference(other.rank, kind, patch_id, expected, found))

    if other.torch_version != ref.torch_version:
        differ("version", "", ref.torch_version, other.torch_version)
    for pid, mine in ref.patches.items():
        theirs = other.patches.get(pid)
        if theirs is None:
            differ("missing", pid, "present", "missing")
        elif mine.patch_hash != theirs.patch_hash:
            differ("variant", pid, f"text {mine.patch_hash[:12]}", f"text {theirs.patch_hash[:12]}")
        elif _UNDECIDED in (mine.state, theirs.state):
            # Undecided may still end up as the other rank's state, unless that one
            # is disabled: a patch that is pending was not disabled at import.
            if "disabled" in (mine.state, theirs.state):
                differ("state", pid, mine.state, theirs.state)
        elif mine.state != theirs.state:
            differ("state", pid, mine.state, theirs.state)
        elif (mine.variant, mine.variant_hash) != (theirs.variant, theirs.variant_hash):
            differ("variant", pid, mine.variant or "none", theirs.variant or "none")
    for pid in other.patches.keys() - ref.patches.keys():
        differ("extra", pid, "absent", "present")
    return out


def _report(entries: list[RankEntry], num_collectives: int) -> RanksReport:
    keys = [(e.torch_version, tuple(sorted(e.patches.items()))) for e in entries]
    counts = Counter(keys)
    # The most common fingerprint is the reference; ties go to the lowest rank.
    ref = min(zip(keys, entries), key=lambda ke: (-counts[ke[0]], ke[1].rank))[1]
    differences = [d for e in entries if e is not ref for d in _compare(ref, e)]
    return RanksReport(tuple(entries), ref.rank, tuple(differences), num_collectives)


def check_ranks(group: ProcessGroup | None = None) -> RanksReport:
    """Compares torch and the overlay's patches across the ranks of ``group``.

    A collective: every rank of ``group`` (default: the world) must call it. Each
    rank's fingerprint holds its torch version (and git commit), and for every
    patch of its series the state (``torch_overlay.status()``), the variant
    decided on and a hash of the patch's text. A patch still ``pending`` on a
    rank (its target not imported there yet) differs in state only from a rank
    where it is ``disabled``.

    One all-gather of a 32-byte hash per rank; when hashes differ, a second
    round (``all_gather_object``) gathers the fingerprints to name the ranks
    that differ and how. Returns a :class:`RanksReport`, equal on every rank.
    Without an initialized process group it compares nothing and reports ok.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_object_coll_device

    if not dist.is_available() or not dist.is_initialized():
        # A single process: nothing to compare with.
        entry = _local_entry(0)
        return RanksReport((entry,), 0, (), num_collectives=0)
    entry = _local_entry(dist.get_rank())
    digest = hashlib.sha256(repr(dataclasses.astuple(entry)[1:]).encode()).digest()
    device = _get_object_coll_device(group)
    mine = torch.frombuffer(bytearray(digest), dtype=torch.int64).to(device)
    size = dist.get_world_size(group)
    gathered = mine.new_empty(size * mine.numel())
    # all_gather_into_tensor is deprecated from torch 2.13 in favour of this name.
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    all_gather(gathered, mine, group=group)
    if (gathered.view(size, -1) == mine).all():
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        entries = tuple(dataclasses.replace(entry, rank=r) for r in ranks)
        return RanksReport(entries, ranks[0], (), num_collectives=1)
    gathered_entries: list[RankEntry | None] = [None] * size
    dist.all_gather_object(gathered_entries, entry, group=group)
    # all_gather_object: one all-gather of the sizes, one of the pickled entries.
    return _report([e for e in gathered_entries if e is not None], num_collectives=3)
