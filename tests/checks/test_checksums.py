"""Checksum rows of check_replicas: layout-independent, chunked without copying a strided tensor."""

from pathlib import Path

import pytest
import torch

from torch_overlay.checks import checksums as _checksums
from torch_overlay.checks.checksums import _pieces, Checksums, EXACT, FLOAT, NONFINITE


def _row(t: torch.Tensor, atol: float = 0.0) -> torch.Tensor:
    return Checksums(atol).row(("t", "param"), t)


@pytest.mark.parametrize("atol", [0.0, 1e-3])
def test_layout_does_not_change_the_row(monkeypatch, atol):
    monkeypatch.setattr(_checksums, "CHUNK", 64)  # many pieces, rows longer than a piece
    base = torch.randn(5, 7, 300, generator=torch.Generator().manual_seed(0))
    for strided in (base.permute(2, 0, 1), base[:, ::2, ::3], base.transpose(0, 2)[::2], base[0, 0, ::5]):
        assert not strided.is_contiguous()
        # The integer words are exact; the float64 sums (a hint for reports) may round differently.
        assert torch.equal(_row(strided, atol)[: FLOAT.start], _row(strided.contiguous(), atol)[: FLOAT.start])
    changed = base.permute(2, 0, 1).clone()
    changed[123, 3, 4] += 1e-3
    assert not torch.equal(_row(changed)[EXACT], _row(base.permute(2, 0, 1))[EXACT])


def test_pieces_are_views_of_the_tensor():
    t = torch.randn(3000, 1000).t()  # 3M elements, column-major
    pieces = list(_pieces(t, 1 << 20))
    assert sum(p.numel() for p in pieces) == t.numel()
    assert max(p.numel() for p in pieces) <= 1 << 20
    assert all(p.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for p in pieces)
    assert torch.equal(torch.cat([p.reshape(-1) for p in pieces]), t.reshape(-1))


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64]
)
def test_dtypes(dtype):
    t = torch.arange(12).reshape(3, 4).to(dtype)
    other = t.clone()
    other.view(-1)[0] = 1
    assert torch.equal(_row(t), _row(t.clone()))
    assert not torch.equal(_row(t)[EXACT], _row(other)[EXACT])


def test_nonfinite_counted():
    t = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    assert _row(t)[NONFINITE] == 3


def _vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


def test_strided_tensor_is_not_copied_whole():
    """Peak memory of a checksum of a 64 MiB transposed tensor: the scratch (16 MiB), not a copy of it."""
    clear = Path("/proc/self/clear_refs")
    try:
        clear.write_text("5")  # resets VmHWM (peak RSS) to the current RSS
    except OSError:
        pytest.skip("cannot reset the peak RSS here")
    t = torch.randn(4096, 4096).t()
    # Warm-up at full size: the first large call also touches kernel code pages and starts the
    # thread pool, which count towards RSS (a 4-element warm-up left them in the measure: 32.4 MiB).
    _row(t)
    clear.write_text("5")
    before = _vm("VmRSS")
    _row(t)
    peak = _vm("VmHWM") - before
    assert peak < t.numel() * t.element_size() // 2, f"peak {peak / 2**20:.0f} MiB"
