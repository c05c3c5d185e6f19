"""Detect replicated DTensor parameters (and grads) whose replicas diverged.

A tensor placed ``Replicate()`` on a mesh dimension must hold the same values on
every rank of that dimension. Nothing in PyTorch verifies it: a gradient that is
really ``Partial`` but marked ``Replicate`` (torchtitan#2387, a replicated MoE
router fed with tokens split across TP ranks) skips its all-reduce and the
replicas drift apart silently. ``check_replicas`` compares a checksum of every
replica with two all-gathers per mesh dimension (what is compared, then the
checksums); ``guard_replicas`` runs it after backward every N steps.

``torch.distributed.tensor`` is imported inside the functions so that importing
``torch_overlay`` stays cheap.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import sys
import warnings
from collections.abc import Callable
from typing import Literal, TYPE_CHECKING

import torch
from torch import nn

from .checksums import (
    Checksums,
    EXACT,
    FLOAT,
    NONFINITE,
    NONFINITE_AT,
    NUMEL,
    QUANTIZED,
    QUANTIZED_WEIGHT,
    ROW_WIDTH,
    STATUS,
)

from .ranks import check_ranks, RanksReport


if TYPE_CHECKING:
    from torch.distributed import ProcessGroup, Work
    from torch.distributed.device_mesh import DeviceMesh
    from torch.utils.hooks import RemovableHandle


__all__ = [
    "ReplicaDivergenceError",
    "ReplicaDivergenceWarning",
    "ReplicaGuard",
    "ReplicaMismatch",
    "ReplicaReport",
    "check_replicas",
    "guard_replicas",
]


# Values of the status column of a checksum row (see ``checksums``).
_ABSENT = 0  # the grad is None
_PRESENT = 1  # compared
_NOT_REPLICATED = 2  # the grad is Shard/Partial on this mesh dim: nothing to compare
# Header sent first over each group: number of rows, digest of what is compared and of atol.
_HEADER_WIDTH = 3
_PRIME = (1 << 61) - 1  # modulus of the integer checksums


class ReplicaDivergenceWarning(UserWarning):
    """Warned by :func:`guard_replicas` with ``action="warn"``."""


@dataclasses.dataclass(frozen=True)
class ReplicaMismatch:
    """One tensor whose replicas disagree along one mesh dimension.

    ``rank_groups`` holds the global ranks of the replica group split by
    checksum: ranks in one tuple agree with each other. The largest group comes
    first (ties: the one holding the lowest rank) and is taken as the reference.
    """

    name: str
    kind: Literal["param", "grad"]
    mesh_dim: int
    mesh_dim_name: str | None
    rank_groups: tuple[tuple[int, ...], ...]
    # Largest gap between the checksums of two groups (inf when a grad is missing
    # on some ranks): a hint of how far apart the replicas are, not an element diff.
    max_checksum_diff: float
    detail: str = ""

    @property
    def disagreeing_ranks(self) -> tuple[int, ...]:
        """Ranks outside the reference (largest) group."""
        return tuple(sorted(r for group in self.rank_groups[1:] for r in group))

    def __str__(self) -> str:
        dim = f"{self.mesh_dim} ({self.mesh_dim_name!r})" if self.mesh_dim_name else str(self.mesh_dim)
        groups = " vs ".join(str(list(group)) for group in self.rank_groups)
        text = f"{self.kind} {self.name!r}: replicas differ on mesh dim {dim}: ranks {groups}"
        if self.detail:
            text += f" ({self.detail})"
        elif math.isfinite(self.max_checksum_diff):
            text += f" (checksum gap {self.max_checksum_diff:.3g})"
        return text


@dataclasses.dataclass(frozen=True)
class ReplicaReport:
    """Result of :func:`check_replicas` on this rank.

    A rank sees the replica groups it belongs to: a divergence among ranks
    sharing no mesh-dim group with this rank is reported on those ranks only.
    """

    mismatches: tuple[ReplicaMismatch, ...]
    # (tensor, mesh dim) pairs compared, skipped ones (grads not Replicate) excluded.
    num_checked: int
    num_collectives: int
    # Ranks running a different torch or different overlay fixes compute different things.
    ranks: RanksReport | None = None

    @property
    def ok(self) -> bool:
        return not self.mismatches and (self.ranks is None or self.ranks.ok)

    @property
    def diverged(self) -> tuple[str, ...]:
        """Names of the parameters with a mismatch, in report order, without repeats."""
        return tuple(dict.fromkeys(m.name for m in self.mismatches))

    def __str__(self) -> str:
        if self.ok:
            return f"replicas agree ({self.num_checked} tensor/mesh-dim pairs checked)"
        parts = [] if self.ranks is None or self.ranks.ok else [str(self.ranks)]
        if self.mismatches:
            head = f"replicas diverged ({self.num_checked} tensor/mesh-dim pairs compared):"
            parts.append("\n  ".join([head, *map(str, self.mismatches)]))
        return "\n".join(parts)


class ReplicaDivergenceError(RuntimeError):
    """Raised when replicas of a ``Replicate`` DTensor disagree."""

    def __init__(self, report: ReplicaReport) -> None:
        super().__init__(str(report))
        self.report = report


@dataclasses.dataclass
class _Slot:
    name: str
    kind: Literal["param", "grad"]
    mesh_dim: int
    mesh_dim_name: str | None


@dataclasses.dataclass
class _Bucket:
    """Everything compared over one process group: a header, then one all-gather of rows."""

    group: ProcessGroup
    device: torch.device
    # Every (parameter, mesh dim) on this group, replicated or not, with what its rows depend
    # on: the ranks must agree on all of it before their rows can be lined up.
    entries: dict[tuple[str, int], tuple[str | None, str]] = dataclasses.field(default_factory=dict)
    slots: list[_Slot] = dataclasses.field(default_factory=list)
    rows: list[torch.Tensor] = dataclasses.field(default_factory=list)

    def header(self, atol: float) -> torch.Tensor:
        digest = hashlib.sha256(repr((atol, list(self.entries.items()))).encode()).digest()
        words = [int.from_bytes(digest[i : i + 8], "little", signed=True) for i in (0, 8)]
        return torch.tensor([len(self.slots), *words], dtype=torch.int64, device=self.device)


def _status_row(status: int, device: torch.device) -> torch.Tensor:
    row = torch.zeros(ROW_WIDTH, dtype=torch.int64, device=device)
    row[STATUS] = status
    return row


def _present(row: torch.Tensor) -> torch.Tensor:
    row = row.clone()
    row[STATUS] = _PRESENT
    return row


def _grad_row(
    checksums: Checksums, name: str, grad: torch.Tensor | None, mesh_dim: int, device: torch.device
) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    if grad is None:
        return _status_row(_ABSENT, device)
    if isinstance(grad, DTensor):
        # A Partial grad is a legitimate pending reduction (the fix for #2387
        # produces one); only grads claiming Replicate must agree.
        if not grad.placements[mesh_dim].is_replicate():
            return _status_row(_NOT_REPLICATED, device)
        return _present(checksums.row((name, "grad"), grad.to_local()))
    return _present(checksums.row((name, "grad"), grad))


def _collect(module: nn.Module, *, grads: bool, params: bool, atol: float) -> list[_Bucket]:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    checksums = Checksums(atol)
    # Keyed by process group so that sub-meshes sharing a group (mesh["tp"] and
    # dim 1 of the (dp, tp) mesh) share one all-gather. Sharded dims count too: a
    # rank whose parameter is Shard where its peers hold Replicate still joins the
    # group's header and learns of the disagreement instead of leaving them waiting.
    buckets: dict[ProcessGroup, _Bucket] = {}
    for name, param in module.named_parameters():
        if not isinstance(param, DTensor):
            continue
        mesh: DeviceMesh = param.device_mesh
        if mesh.get_coordinate() is None:
            continue
        local = param.to_local()
        for mesh_dim, placement in enumerate(param.placements):
            if mesh.size(mesh_dim) == 1:
                continue
            group = mesh.get_group(mesh_dim)
            bucket = buckets.setdefault(group, _Bucket(group, local.device))
            dim_name = mesh.mesh_dim_names[mesh_dim] if mesh.mesh_dim_names else None
            kinds = [kind for kind, on in (("param", params), ("grad", grads)) if on and placement.is_replicate()]
            compared = " and ".join(kinds) or "not compared"
            bucket.entries[(name, mesh_dim)] = (
                dim_name,
                f"{list(param.placements)} {tuple(param.shape)} {param.dtype}, {compared}",
            )
            for kind in kinds:
                bucket.slots.append(_Slot(name, kind, mesh_dim, dim_name))  # type: ignore[arg-type]  # "param" or "grad"
                if kind == "param":
                    bucket.rows.append(_present(checksums.row((name, "param"), local)))
                else:
                    bucket.rows.append(_grad_row(checksums, name, param.grad, mesh_dim, local.device))
    # The same order on every rank, whatever the order of its parameters.
    return sorted(buckets.values(), key=lambda b: dist.get_process_group_ranks(b.group))


def _agree(a: torch.Tensor, b: torch.Tensor, atol: float) -> torch.Tensor:
    """Whether checksum rows ``a`` and ``b`` (broadcast) agree, over the last dim."""
    exact = (a[..., EXACT] == b[..., EXACT]).all(dim=-1)
    if atol == 0:
        return exact
    # Size and non-finite values exactly; each finite element moves its quantized value
    # floor(x / atol) by at most 1, so the quantized sums by at most numel (times the weight).
    same_shape = (a[..., NUMEL : NONFINITE_AT + 1] == b[..., NUMEL : NONFINITE_AT + 1]).all(dim=-1)
    gap = (a[..., QUANTIZED] - b[..., QUANTIZED]).remainder(_PRIME)
    gap = torch.where(gap > _PRIME // 2, _PRIME - gap, gap)
    numel = b[..., NUMEL].unsqueeze(-1)
    tol = numel * torch.tensor([1, QUANTIZED_WEIGHT], dtype=torch.int64)
    return same_shape & (exact | (gap <= tol).all(dim=-1))


def _float_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    gap = (a[FLOAT].view(torch.float64) - b[FLOAT].view(torch.float64)).abs().max().item()
    if a[NONFINITE] != b[NONFINITE] or a[NONFINITE_AT] != b[NONFINITE_AT] or math.isnan(gap):
        return math.inf
    return gap


def _split_ranks(rows: torch.Tensor, ranks: list[int], atol: float) -> tuple[tuple[tuple[int, ...], ...], float]:
    """Groups the ranks of one slot by checksum; rows is (group size, row width)."""
    reps: list[torch.Tensor] = []
    members: list[list[int]] = []
    for row, rank in zip(rows, ranks, strict=True):
        for rep, group in zip(reps, members, strict=True):
            if _agree(row, rep, atol):
                group.append(rank)
                break
        else:
            reps.append(row)
            members.append([rank])
    order = sorted(range(len(members)), key=lambda i: (-len(members[i]), members[i][0]))
    gap = max((_float_gap(reps[i], reps[order[0]]) for i in order[1:]), default=0.0)
    return tuple(tuple(members[i]) for i in order), gap


def _compare(bucket: _Bucket, gathered: torch.Tensor, atol: float) -> tuple[list[ReplicaMismatch], int]:
    import torch.distributed as dist

    ranks = dist.get_process_group_ranks(bucket.group)
    # (group size, slots, row width), rows in group-rank order
    rows = gathered.cpu().view(len(ranks), len(bucket.slots), ROW_WIDTH)
    status = rows[..., STATUS]
    same_status = (status == status[0]).all(dim=0)
    compared = same_status & (status[0] == _PRESENT)
    agree = _agree(rows, rows[0], atol).all(dim=0)
    bad = (~same_status) | (compared & ~agree)

    mismatches = []
    for index in bad.nonzero().flatten().tolist():
        slot = bucket.slots[index]
        rank_groups, gap = _split_ranks(rows[:, index], ranks, atol)
        detail = ""
        if not same_status[index]:
            statuses = zip(ranks, status[:, index].tolist(), strict=True)
            missing = [r for r, s in statuses if s == _ABSENT]
            # Only a grad can be absent or not Replicate on some ranks.
            detail = f"grad is None on ranks {missing}" if missing else "grad placements differ"
            gap = math.inf
        elif (rows[:, index, NUMEL] != rows[0, index, NUMEL]).any():
            detail = "local sizes differ"
        mismatches.append(
            ReplicaMismatch(slot.name, slot.kind, slot.mesh_dim, slot.mesh_dim_name, rank_groups, gap, detail)
        )
    return mismatches, int(compared.sum())


def _describe_disagreement(bucket: _Bucket, atol: float) -> list[ReplicaMismatch]:
    """Which parameters the ranks of ``bucket``'s group hold differently (a blocking exchange)."""
    import torch.distributed as dist

    ranks = dist.get_process_group_ranks(bucket.group)
    sent: list[tuple[float, list[tuple[tuple[str, int], tuple[str | None, str]]]]] = [(0.0, []) for _ in ranks]
    dist.all_gather_object(sent, (atol, list(bucket.entries.items())), group=bucket.group)
    atols = [a for a, _ in sent]
    held = [entries for _, entries in sent]
    tables = [dict(entries) for entries in held]
    mismatches = []
    for key in dict.fromkeys(key for entries in held for key, _ in entries):
        values = [table.get(key) for table in tables]
        if len(set(values)) == 1:
            continue
        by_value: dict[tuple[str | None, str] | None, list[int]] = {}
        for rank, value in zip(ranks, values, strict=True):
            by_value.setdefault(value, []).append(rank)
        groups = sorted(by_value.items(), key=lambda item: (-len(item[1]), item[1][0]))
        detail = "ranks disagree on what it is: " + "; ".join(
            f"{value[1] if value else 'absent'} on ranks {members}" for value, members in groups
        )
        dim_name = next(value[0] for value in values if value)
        mismatches.append(
            ReplicaMismatch(key[0], "param", key[1], dim_name, tuple(tuple(m) for _, m in groups), math.inf, detail)
        )
    if not mismatches:
        # The same parameters in another order (named_parameters() differs), or another atol.
        (name, mesh_dim), (dim_name, _) = next(iter(bucket.entries.items()))
        detail = (
            f"ranks passed different atol values {atols}"
            if len(set(atols)) > 1
            else "ranks list their parameters in different orders"
        )
        mismatches.append(
            ReplicaMismatch(name, "param", mesh_dim, dim_name, (tuple(ranks),), math.inf, detail + "; nothing compared")
        )
    return mismatches


def _all_gather(tensor: torch.Tensor, group: ProcessGroup) -> tuple[torch.Tensor, Work]:
    import torch.distributed as dist

    # all_gather_into_tensor is deprecated from torch 2.13 in favour of this name.
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    out = tensor.new_empty(dist.get_world_size(group) * tensor.shape[0], *tensor.shape[1:])
    return out, all_gather(out, tensor, group=group, async_op=True)


def check_replicas(
    module: nn.Module,
    *,
    grads: bool = True,
    params: bool = True,
    atol: float = 0.0,
    raise_on_divergence: bool = False,
) -> ReplicaReport:
    """Checks that every replica of each ``Replicate`` DTensor parameter agrees.

    For each DTensor parameter of ``module`` and each mesh dimension where it is
    ``Replicate()`` (size > 1), the local tensor (``params``) and its ``.grad``
    (``grads``, when the grad itself is ``Replicate`` on that dim) are reduced to
    a checksum row (exact integer hashes of the bit patterns, the count and
    positions of non-finite values, float64 sums of the finite part). Per
    distinct mesh-dim process group, the ranks first all-gather a small header
    (a digest of the names, placements, shapes and dtypes of the parameters on
    that group): if it differs, every rank of the group reports the parameters
    held differently and compares nothing there. Otherwise the rows are
    all-gathered in one collective. Every rank of every mesh holding a
    parameter of ``module`` must call it, in the same order as other collectives.
    It first runs :func:`check_ranks` on the world group, so every rank must call it.

    ``atol=0`` requires bit-identical replicas (NaN payloads aside). With
    ``atol > 0`` sizes and non-finite positions must match, and the finite
    elements quantized to ``floor(x / atol)`` may differ by ``numel`` in sum
    (elements within ``atol`` of each other move it by at most 1 each). All
    ranks must pass the same ``atol`` (otherwise reported, nothing compared). Returns
    a :class:`ReplicaReport`; with ``raise_on_divergence`` a divergence raises
    :class:`ReplicaDivergenceError` instead.
    """
    if atol < 0:
        raise ValueError(f"atol must be >= 0, got {atol}")
    ranks = check_ranks()
    with torch.no_grad():
        buckets = _collect(module, grads=grads, params=params, atol=atol)
        # Round 1: every group agrees on what it compares (issued together, then waited on).
        headers = [(bucket, *_all_gather(bucket.header(atol), bucket.group)) for bucket in buckets]
        agreed: list[_Bucket] = []
        disagreed: list[_Bucket] = []
        for bucket, gathered, work in headers:
            work.wait()
            rows = gathered.cpu().view(-1, _HEADER_WIDTH)
            (agreed if (rows == rows[0]).all() else disagreed).append(bucket)
        # Round 2: the checksum rows of each group that agreed and has something to compare.
        pending = [(bucket, *_all_gather(torch.stack(bucket.rows), bucket.group)) for bucket in agreed if bucket.slots]
        mismatches: list[ReplicaMismatch] = []
        for bucket in disagreed:
            mismatches += _describe_disagreement(bucket, atol)
        num_checked = 0
        for bucket, gathered, work in pending:
            work.wait()
            found, checked = _compare(bucket, gathered, atol)
            mismatches += found
            num_checked += checked
    num_collectives = len(headers) + len(disagreed) + len(pending) + ranks.num_collectives
    report = ReplicaReport(tuple(mismatches), num_checked, num_collectives, ranks)
    if raise_on_divergence and not report.ok:
        raise ReplicaDivergenceError(report)
    return report


def _caller_stacklevel() -> int:
    """Stack level of the first frame outside torch and this module.

    The guard's check runs inside autograd's engine; its warning should point at
    the ``backward()`` call of the training loop, not at torch internals.
    """
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and (
        frame.f_code.co_filename.startswith(torch_dir) or frame.f_code.co_filename == __file__
    ):
        frame, level = frame.f_back, level + 1
    return level


class ReplicaGuard:
    """Handle returned by :func:`guard_replicas`; ``remove()`` detaches it."""

    def __init__(
        self,
        module: nn.Module,
        *,
        every: int,
        action: Literal["warn", "raise"],
        grads: bool,
        params: bool,
        atol: float,
    ) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        if action not in ("warn", "raise"):
            raise ValueError(f"action must be 'warn' or 'raise', got {action!r}")
        self.module = module
        self.every = every
        self.action = action
        self.num_backwards = 0
        self.last_report: ReplicaReport | None = None
        self._check: Callable[[], ReplicaReport] = lambda: check_replicas(module, grads=grads, params=params, atol=atol)
        self._queued = False
        # Any parameter receiving a grad queues one end-of-backward callback: a
        # hook on a single parameter would miss backwards that skip it (an
        # unused expert), and grads are only all accumulated once backward ends.
        self._handles: list[RemovableHandle] = [
            param.register_post_accumulate_grad_hook(self._on_grad_accumulated)
            for param in module.parameters()
            if param.requires_grad
        ]

    def _on_grad_accumulated(self, param: torch.Tensor) -> None:
        if self._queued:
            return
        self._queued = True
        torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)

    def _after_backward(self) -> None:
        self._queued = False
        self.num_backwards += 1
        if self.num_backwards % self.every:
            return
        report = self.last_report = self._check()
        if report.ok:
            return
        if self.action == "raise":
            raise ReplicaDivergenceError(report)
        warnings.warn(str(report), ReplicaDivergenceWarning, stacklevel=_caller_stacklevel())

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> ReplicaGuard:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


def guard_replicas(
    module: nn.Module,
    *,
    every: int = 1,
    action: Literal["warn", "raise"] = "warn",
    grads: bool = True,
    params: bool = True,
    atol: float = 0.0,
) -> ReplicaGuard:
    """Runs :func:`check_replicas` at the end of every ``every``-th backward.

    Opt-in and loop-free: post-accumulate-grad hooks on the parameters of
    ``module`` queue the check to run once all grads of the backward are
    accumulated (before the optimizer step), so a wrong grad placement is caught
    at the first step and diverged parameters at the next check. Backwards are
    counted on each rank, so all ranks must run the same backwards. ``action``
    is ``"warn"`` (:class:`ReplicaDivergenceWarning`) or ``"raise"``
    (:class:`ReplicaDivergenceError` out of ``backward()``). Register it after
    the model is parallelized: parameters swapped later are not hooked. Returns
    a :class:`ReplicaGuard`; call ``remove()`` or use it as a context manager.
    """
    return ReplicaGuard(module, every=every, action=action, grads=grads, params=params, atol=atol)
