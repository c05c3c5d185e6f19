"""Detect replicated DTensor parameters (and grads) whose replicas diverged.

A tensor placed ``Replicate()`` on a mesh dimension must hold the same values on
every rank of that dimension. Nothing in PyTorch verifies it: a gradient that is
really ``Partial`` but marked ``Replicate`` (torchtitan#2387, a replicated MoE
router fed with tokens split across TP ranks) skips its all-reduce and the
replicas drift apart silently. ``check_replicas`` compares a checksum of every
replica with one all-gather per mesh dimension; ``guard_replicas`` runs it after
backward every N steps.

``torch.distributed.tensor`` is imported inside the functions so that importing
``torch_overlay`` stays cheap.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import warnings
from collections.abc import Callable
from typing import Literal, TYPE_CHECKING

import torch
from torch import nn

from .ranks import check_ranks, RanksReport

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
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


# Columns of one checksum row; every rank of a group sends one row per slot.
_STATUS, _NUMEL, _SUM, _WEIGHTED_SUM, _ABS_SUM = range(5)
_ROW_WIDTH = 5

# Values of the status column.
_ABSENT = 0.0  # the grad is None
_PRESENT = 1.0  # compared
_NOT_REPLICATED = 2.0  # the grad is Shard/Partial on this mesh dim: nothing to compare

# Elements copied to float64 at a time: bounds the scratch memory of a check
# (two float64 vectors of this length per device).
_CHUNK = 1 << 20
# Position weights are 0.5 + frac(i * phi) (a Weyl sequence): distinct for every
# index of a chunk, so swapping two different values changes the weighted sum.
_PHI = (math.sqrt(5.0) - 1.0) / 2.0
_MAX_WEIGHT = 1.5


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
        dim = (
            f"{self.mesh_dim} ({self.mesh_dim_name!r})"
            if self.mesh_dim_name
            else str(self.mesh_dim)
        )
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
    """Everything compared over one process group, sent in one all-gather."""

    group: ProcessGroup
    slots: list[_Slot] = dataclasses.field(default_factory=list)
    rows: list[torch.Tensor] = dataclasses.field(default_factory=list)


class _Checksums:
    """float64 checksums of local tensors, each computed once per call."""

    def __init__(self) -> None:
        # Per device: position weights and a float64 buffer, reused across chunks
        # and tensors (a fresh cast per chunk costs more than the reductions).
        self._scratch: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._cache: dict[tuple[str, str], torch.Tensor] = {}

    def _scratch_for(self, device: torch.device, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        scratch = self._scratch.get(device)
        if scratch is None or scratch[0].numel() < n:
            size = min(_CHUNK, max(n, 2 * scratch[0].numel() if scratch else 0))
            weights = torch.arange(size, dtype=torch.float64, device=device)
            weights = weights.mul_(_PHI).frac_().add_(0.5)
            scratch = self._scratch[device] = (weights, torch.empty_like(weights))
        weights, buffer = scratch
        return weights[:n], buffer[:n]

    def _compute(self, local: torch.Tensor) -> torch.Tensor:
        flat = local.detach().reshape(-1)
        if flat.is_complex():
            flat = torch.view_as_real(flat).reshape(-1)
        sums = torch.zeros(3, dtype=torch.float64, device=flat.device)
        for start in range(0, flat.numel(), _CHUNK):
            chunk = flat[start : start + _CHUNK]
            weights, buffer = self._scratch_for(chunk.device, chunk.numel())
            buffer.copy_(chunk)
            # abs_ goes last: it overwrites the copy the other two read.
            sums += torch.stack([buffer.sum(), torch.dot(buffer, weights), buffer.abs_().sum()])
        head = torch.tensor([_PRESENT, flat.numel()], dtype=torch.float64, device=flat.device)
        return torch.cat([head, sums])

    def row(self, key: tuple[str, str], local: torch.Tensor) -> torch.Tensor:
        row = self._cache.get(key)
        if row is None:
            row = self._cache[key] = self._compute(local)
        return row


def _status_row(status: float, device: torch.device) -> torch.Tensor:
    row = torch.zeros(_ROW_WIDTH, dtype=torch.float64, device=device)
    row[_STATUS] = status
    return row


def _grad_row(
    checksums: _Checksums, name: str, grad: torch.Tensor | None, mesh_dim: int, device: torch.device
) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    if grad is None:
        return _status_row(_ABSENT, device)
    if isinstance(grad, DTensor):
        # A Partial grad is a legitimate pending reduction (the fix for #2387
        # produces one); only grads claiming Replicate must agree.
        if not grad.placements[mesh_dim].is_replicate():
            return _status_row(_NOT_REPLICATED, device)
        return checksums.row((name, "grad"), grad.to_local())
    return checksums.row((name, "grad"), grad)


def _collect(module: nn.Module, *, grads: bool, params: bool) -> list[_Bucket]:
    from torch.distributed.tensor import DTensor

    checksums = _Checksums()
    # Keyed by process group so that sub-meshes sharing a group (mesh["tp"] and
    # dim 1 of the (dp, tp) mesh) share one all-gather. Insertion order follows
    # named_parameters(), the same on every rank, so collectives are issued in
    # the same order everywhere.
    buckets: dict[ProcessGroup, _Bucket] = {}
    for name, param in module.named_parameters():
        if not isinstance(param, DTensor):
            continue
        mesh: DeviceMesh = param.device_mesh
        if mesh.get_coordinate() is None:
            continue
        local = param.to_local()
        for mesh_dim, placement in enumerate(param.placements):
            if not placement.is_replicate() or mesh.size(mesh_dim) == 1:
                continue
            group = mesh.get_group(mesh_dim)
            bucket = buckets.setdefault(group, _Bucket(group))
            dim_name = mesh.mesh_dim_names[mesh_dim] if mesh.mesh_dim_names else None
            if params:
                bucket.slots.append(_Slot(name, "param", mesh_dim, dim_name))
                bucket.rows.append(checksums.row((name, "param"), local))
            if grads:
                bucket.slots.append(_Slot(name, "grad", mesh_dim, dim_name))
                bucket.rows.append(_grad_row(checksums, name, param.grad, mesh_dim, local.device))
    return [bucket for bucket in buckets.values() if bucket.slots]


def _same(a: torch.Tensor, b: torch.Tensor, tol: torch.Tensor) -> torch.Tensor:
    # NaN checksums on both sides count as equal: the replicas may well be equal,
    # and a NaN loss is not this check's business.
    close = (a == b) | (a.isnan() & b.isnan()) | ((a - b).abs() <= tol)
    return close.all(dim=-1)


def _tolerance(rows: torch.Tensor, atol: float) -> torch.Tensor:
    # Element differences of at most atol move each sum by at most atol * numel
    # (times the largest weight for the weighted sum); status and numel must match.
    numel = rows[..., _NUMEL]
    scale = torch.tensor([0.0, 0.0, 1.0, _MAX_WEIGHT, 1.0], dtype=torch.float64)
    return atol * numel.unsqueeze(-1) * scale


def _split_ranks(
    rows: torch.Tensor, ranks: list[int], atol: float
) -> tuple[tuple[tuple[int, ...], ...], float]:
    """Groups the ranks of one slot by checksum; rows is (group size, row width)."""
    reps: list[torch.Tensor] = []
    members: list[list[int]] = []
    for row, rank in zip(rows, ranks, strict=True):
        for rep, group in zip(reps, members, strict=True):
            if _same(row, rep, _tolerance(rep, atol)):
                group.append(rank)
                break
        else:
            reps.append(row)
            members.append([rank])
    order = sorted(range(len(members)), key=lambda i: (-len(members[i]), members[i][0]))
    gap = 0.0
    for i in order[1:]:
        diff = (reps[i][_SUM:] - reps[order[0]][_SUM:]).abs().max().item()
        gap = max(gap, diff if not math.isnan(diff) else math.inf)
    return tuple(tuple(members[i]) for i in order), gap


def _compare(
    bucket: _Bucket, gathered: torch.Tensor, atol: float
) -> tuple[list[ReplicaMismatch], int]:
    import torch.distributed as dist

    ranks = dist.get_process_group_ranks(bucket.group)
    # (group size, slots, row width), rows in group-rank order
    rows = gathered.cpu().view(len(ranks), len(bucket.slots), _ROW_WIDTH)
    status = rows[..., _STATUS]
    same_status = (status == status[0]).all(dim=0)
    compared = same_status & (status[0] == _PRESENT)
    agree = _same(rows, rows[0], _tolerance(rows[0], atol)).all(dim=0)
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
        mismatches.append(
            ReplicaMismatch(
                slot.name, slot.kind, slot.mesh_dim, slot.mesh_dim_name, rank_groups, gap, detail
            )
        )
    return mismatches, int(compared.sum())


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
    a float64 checksum: sum, sum of absolute values and a position-weighted sum
    (which catches permuted elements). All checksums bound for one process group
    are all-gathered together: one collective per distinct mesh-dim group,
    whatever the number of parameters. It first runs :func:`check_ranks` on the
    world group, so every rank must call it, in the same order as other collectives.

    ``atol`` is an element-wise tolerance: checksums may differ by up to
    ``atol * numel`` (``1.5 *`` that for the weighted sum). ``atol=0`` requires
    identical checksums, which correct replicas have when all ranks run the same
    kernels. Returns a :class:`ReplicaReport`; with ``raise_on_divergence`` a
    divergence raises :class:`ReplicaDivergenceError` instead.
    """
    import torch.distributed as dist

    if atol < 0:
        raise ValueError(f"atol must be >= 0, got {atol}")
    ranks = check_ranks()
    # all_gather_into_tensor is deprecated from torch 2.13 in favour of this name.
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    with torch.no_grad():
        buckets = _collect(module, grads=grads, params=params)
        pending = []
        for bucket in buckets:
            rows = torch.stack([row.to(bucket.rows[0].device) for row in bucket.rows])
            size = dist.get_world_size(bucket.group)
            gathered = rows.new_empty(size * rows.shape[0], _ROW_WIDTH)
            # Issue every all-gather before waiting so they overlap.
            work = all_gather(gathered, rows, group=bucket.group, async_op=True)
            pending.append((bucket, gathered, work))
        mismatches: list[ReplicaMismatch] = []
        num_checked = 0
        for bucket, gathered, work in pending:
            work.wait()
            found, checked = _compare(bucket, gathered, atol)
            mismatches += found
            num_checked += checked
    num_collectives = len(pending) + ranks.num_collectives
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
        self._check: Callable[[], ReplicaReport] = lambda: check_replicas(
            module, grads=grads, params=params, atol=atol
        )
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
