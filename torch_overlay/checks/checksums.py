"""Checksums of local tensors for :mod:`torch_overlay.checks.replicas`.

One row of int64 words per tensor, in three parts:

- exact: the number of elements, the count and positions of non-finite values (NaN, +inf and
  -inf told apart), and per 16-bit limb of each element's bit pattern a plain sum and a
  position-weighted sum modulo the prime 2^61 - 1. Integer sums do not depend on the order of
  reduction, so identical tensors give identical words on any device and thread count, and no
  magnitude (1e20, inf) can hide a difference elsewhere in the tensor;
- tolerant (only with ``atol > 0``): each finite element quantized to ``floor(x / atol)``
  (modulo 2^32), summed plainly and position-weighted, in integers: replicas within ``atol``
  per element differ by at most ``numel`` (``1024 * numel`` weighted), and a huge element
  equal on all replicas cancels exactly instead of rounding other differences away;
- a hint for reports: float64 sum, position-weighted sum and sum of absolute values of the
  finite elements (their bits stored in int64 words).

Elements are visited in logical (row-major) order, in pieces of at most ``CHUNK`` elements
copied into reused scratch buffers: a non-contiguous tensor is never copied whole.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = [
    "CHUNK",
    "Checksums",
    "EXACT",
    "FLOAT",
    "NONFINITE",
    "NONFINITE_AT",
    "NUMEL",
    "QUANTIZED",
    "QUANTIZED_WEIGHT",
    "ROW_WIDTH",
    "STATUS",
]

# Row layout. STATUS is set by the caller (present, absent, not replicated).
STATUS, NUMEL, NONFINITE, NONFINITE_AT = range(4)
_LIMBS = 4  # 16-bit limbs of the widest element (64 bits); per limb a plain and a weighted sum
QUANTIZED = slice(4 + 2 * _LIMBS, 6 + 2 * _LIMBS)  # sum, weighted sum of floor(x / atol)
FLOAT = slice(QUANTIZED.stop, QUANTIZED.stop + 3)  # float64 sum, weighted sum, abs sum
EXACT = slice(NUMEL, QUANTIZED.start)
ROW_WIDTH = FLOAT.stop

# Elements copied at a time: the scratch memory is four 8-byte vectors this long (16 MiB).
CHUNK = 1 << 19
_PRIME = (1 << 61) - 1
# Integer position weights 1 + (i * _MULT mod _WMOD), distinct for 2^26 consecutive positions;
# below 2^26 so that a chunk's weighted limb sum stays below 2^62 (no int64 overflow).
_WMOD = (1 << 26) - 5  # prime
_MULT = 0x9E3779B1 % _WMOD
# Weights of the quantized weighted sum: 1 + (w mod 1024), so that q < 2^32 times a weight
# summed over a chunk stays below 2^62.
QUANTIZED_WEIGHT = 1024
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _pieces(t: torch.Tensor, size: int) -> Iterator[torch.Tensor]:
    """Views covering ``t`` in row-major order, each of at most ``size`` elements."""
    if t.numel() == 0:
        return
    if t.dim() <= 1 or t.is_contiguous():
        flat = t.reshape(-1)  # a view: contiguous, or at most one dimension
        for start in range(0, flat.numel(), size):
            yield flat[start : start + size]
    elif t[0].numel() > size:
        for sub in t:
            yield from _pieces(sub, size)
    else:
        step = size // t[0].numel()
        for start in range(0, t.shape[0], step):
            yield t[start : start + step]


class Checksums:
    """Checksum rows of local tensors, each computed once per call of the check."""

    def __init__(self, atol: float) -> None:
        self.atol = atol
        # Per device: four 8-byte buffers of up to CHUNK elements, reused across pieces and
        # tensors; every intermediate is written into them, so they bound the scratch memory.
        self._scratch: dict[torch.device, torch.Tensor] = {}
        self._cache: dict[tuple[str, str], torch.Tensor] = {}

    def row(self, key: tuple[str, str], local: torch.Tensor) -> torch.Tensor:
        row = self._cache.get(key)
        if row is None:
            row = self._cache[key] = self._compute(local.detach())
        return row

    def _buffers(self, device: torch.device, n: int) -> list[torch.Tensor]:
        scratch = self._scratch.get(device)
        if scratch is None or scratch.shape[1] < n:
            size = min(CHUNK, max(n, 2 * scratch.shape[1] if scratch is not None else 0))
            scratch = self._scratch[device] = torch.empty(4, size, dtype=torch.int64, device=device)
        return list(scratch[:, :n])

    def _compute(self, t: torch.Tensor) -> torch.Tensor:
        if t.is_complex():
            t = torch.view_as_real(t)
        device = t.device
        floating = t.is_floating_point()
        bits_dtype = _BITS[t.element_size()]
        limbs = max(1, t.element_size() // 2)
        exact = torch.zeros(4 + 2 * _LIMBS, dtype=torch.int64, device=device)
        floats = torch.zeros(3, dtype=torch.float64, device=device)
        zero = torch.zeros((), dtype=torch.int64, device=device)
        start = 0
        for piece in _pieces(t, CHUNK):
            n = piece.numel()
            bits, values, weights, tmp = self._buffers(device, n)
            values, tmp_float = values.view(torch.float64), tmp.view(torch.float64)
            bits.view(piece.shape).copy_(piece.view(bits_dtype))
            values.view(piece.shape).copy_(piece)
            torch.arange(start, start + n, out=weights).mul_(_MULT).remainder_(_WMOD).add_(1)
            sums = [zero, zero]
            if floating:
                bad = ~values.isfinite()
                if bad.any():
                    # 1 NaN, 2 +inf, 3 -inf, at its position; then out of every other sum.
                    tmp.fill_(3).masked_fill_(values > 0, 2).masked_fill_(values.isnan(), 1).masked_fill_(~bad, 0)
                    sums = [bad.sum(), tmp.mul_(weights).sum()]
                    bits.masked_fill_(bad, 0)
                    values.masked_fill_(bad, 0.0)
            for limb in range(_LIMBS):
                if limb < limbs:
                    torch.bitwise_right_shift(bits, 16 * limb, out=tmp).bitwise_and_(0xFFFF)
                    sums += [tmp.sum(), tmp.mul_(weights).sum()]
                else:
                    sums += [zero, zero]
            if self.atol > 0:
                # floor and remainder of an integer-valued float64 are exact: the same on every device.
                torch.div(values, self.atol, out=tmp_float).floor_().remainder_(1 << 32).nan_to_num_(0.0)
                quantized = bits.copy_(tmp_float)  # the bit patterns are summed already
                torch.remainder(weights, QUANTIZED_WEIGHT, out=tmp).add_(1)
                sums += [quantized.sum(), quantized.mul_(tmp).sum()]
            else:
                sums += [zero, zero]
            exact += torch.stack(sums)
            exact.remainder_(_PRIME)
            torch.div(weights, _WMOD, out=tmp_float).add_(0.5)
            # abs_ goes last: it overwrites the copy the other two read.
            floats += torch.stack([values.sum(), torch.dot(values, tmp_float), values.abs_().sum()])
            start += n
        head = torch.tensor([0, t.numel()], dtype=torch.int64, device=device)
        return torch.cat([head, exact, floats.view(torch.int64)])
