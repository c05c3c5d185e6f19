"""``build.sh matrix``'s table: cells from status and verify reports, checked against the fields."""

from __future__ import annotations

import json
from pathlib import Path

from torch_overlay.cli.verify import VERDICTS
from torch_overlay.series.patchfile import PatchFile
from torch_overlay.series.series import Patch
from torch_overlay.tools.matrix import run_matrix


def _patch(pid: str, **fields: str) -> Patch:
    variant = PatchFile(Path(f"0001-{pid}.patch"), pid, {"Overlay-Id": pid, **fields}, "", ())
    return Patch(pid, [variant])


def _reports(tmp_path: Path, torch: str, states: dict[str, str], verdicts: dict[str, str]) -> list[Path]:
    status = {"torch": torch, "patches": [{"id": k, "state": v, "reason": "r"} for k, v in states.items()]}
    kinds = {text: kind for kind, text in VERDICTS.values()}
    verify = {
        "torch": torch,
        "verdicts": [{"id": k, "kind": kinds.get(v, "not-run"), "verdict": v} for k, v in verdicts.items()],
    }
    (tmp_path / f"{torch}.status.json").write_text(json.dumps(status))
    (tmp_path / f"{torch}.verify.json").write_text(json.dumps(verify))
    return [tmp_path / f"{torch}.status.json", tmp_path / f"{torch}.verify.json"]


def test_cells_agree_with_the_fields(tmp_path, capsys):
    patches = [
        _patch("fix-a", Affects="2.11.0", **{"Applied-Upstream": "2.13.0"}),
        _patch("fix-b", Affects="2.11.0, 2.13.0"),
    ]
    reports = _reports(
        tmp_path,
        "2.11.0+cpu",
        {"fix-a": "applied", "fix-b": "applied"},
        {
            "fix-a": "bug present without, fixed with the overlay",
            "fix-b": "bug present without, fixed with the overlay",
        },
    )
    reports += _reports(
        tmp_path,
        "2.13.0+cpu",
        {"fix-a": "upstream", "fix-b": "applied"},
        {"fix-b": "bug present without, fixed with the overlay"},
    )
    out = tmp_path / "matrix.md"
    assert run_matrix(reports, patches, out) == 0, capsys.readouterr().out
    table = out.read_text()
    assert "| fix | 2.11.0 | 2.13.0 |" in table
    assert "| `fix-a` | **bug present** | upstream |" in table
    assert "| `fix-b` | **bug present** | **bug present** |" in table


def test_a_cell_against_the_fields_fails_the_run(tmp_path, capsys):
    patches = [_patch("fix-a", Affects="2.11.0"), _patch("fix-b", Affects="2.11.0"), _patch("fix-c", Affects="2.11.0")]
    reports = _reports(
        tmp_path,
        "2.11.0",
        {"fix-a": "applied", "fix-b": "applied", "fix-c": "not needed"},
        {
            "fix-a": "not needed on this torch (passes without the overlay)",
            "fix-b": "NOT FIXED: the reproducer fails with the overlay",
        },
    )
    reports += _reports(
        tmp_path,
        "2.13.0",
        {"fix-a": "applied", "fix-b": "upstream", "fix-c": "upstream"},
        {"fix-a": "bug present without, fixed with the overlay"},
    )
    assert run_matrix(reports, patches, tmp_path / "matrix.md") == 1
    out = capsys.readouterr().out
    assert "fix-a on 2.11.0: Affects lists it, but the reproducer passes without the overlay" in out
    assert "fix-a on 2.13.0: the bug is present, but Affects (2.11.0) omits it" in out
    assert "fix-b on 2.11.0: NOT FIXED" in out
    assert "fix-c on 2.11.0: Affects lists it, but status says not needed" in out
