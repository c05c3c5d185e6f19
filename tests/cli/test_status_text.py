"""``python -m torch_overlay status`` as text: why each fix matters here, a summary, the terminal width."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from torch_overlay._state import PatchState, PatchStatus, Target
from torch_overlay.cli.report import affected_span, format_late_imports, format_status, status_summary, why_needed
from torch_overlay.series.patchfile import parse_patch
from torch_overlay.series.series import Patch

REPO = Path(__file__).resolve().parents[2]
TARGET = "torch/distributed/tensor/_api.py"


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-m", "torch_overlay", *args], env=full_env, capture_output=True, text=True)


def _patch(tmp_path: Path, pid: str, **fields: str) -> Patch:
    path = tmp_path / f"0007-{pid}.patch"
    extra = "".join(f"{k}: {v}\n" for k, v in fields.items())
    path.write_text(
        f"Subject: [PATCH] {pid}\n\nOverlay-Id: {pid}\n{extra}\nFixture.\n---\n"
        f"--- a/{TARGET}\n+++ b/{TARGET}\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"
    )
    return Patch(pid, [parse_patch(path)])


def _row(pid: str, state: PatchState, reason: str, bug: str = "", variant: str = "", mode: str = "") -> PatchStatus:
    return PatchStatus(pid, f"title of {pid}", bug, (Target.from_path(TARGET),), state, reason, variant, mode)


def test_affected_span_joins_consecutive_minors():
    assert affected_span("2.11.0, 2.12.1, 2.13.0, 2.14.1, 2.15.0") == "2.11-2.15"
    assert affected_span("2.11.0") == "2.11"
    assert affected_span("2.11.0, 2.13.0, 2.14.1") == "2.11, 2.13-2.14"


def test_why_needed_says_where_it_breaks_and_where_upstream_stands():
    vendor = {"Origin": "vendor", "Forwarded": "no", "Affects": "2.11.0, 2.12.1, 2.13.0, 2.14.1, 2.15.0"}
    assert why_needed(vendor) == "broken on 2.11-2.15, unfixed upstream"
    backport = {
        "Origin": "backport, https://github.com/pytorch/pytorch/pull/183837",
        "Applied-Upstream": "2.14.0",
        "Affects": "2.11.0, 2.12.1, 2.13.0",
    }
    assert why_needed(backport) == "broken on 2.11-2.13; backport of pytorch#183837, in torch 2.14.0"
    forwarded = {**vendor, "Forwarded": "https://github.com/pytorch/pytorch/pull/5"}
    assert why_needed(forwarded).endswith("unfixed upstream; proposed upstream as pytorch#5")


def test_rows_say_why_what_and_found_here(tmp_path):
    found = _patch(tmp_path, "found-here", Origin="vendor", Forwarded="no", Affects="2.13.0")
    issue = "https://github.com/pytorch/pytorch/issues/9"
    reported = _patch(tmp_path, "reported", Origin="vendor", Affects="2.12.1, 2.13.0", Bug=issue)
    applied = "0007-found-here.patch: DTensor.f"
    rows = [
        _row("found-here", PatchState.APPLIED, applied, variant="0007-found-here.patch", mode="at import"),
        _row("reported", PatchState.UPSTREAM, "fixed upstream in torch 2.13.0", bug=issue),
    ]
    text = format_status(rows, {"found-here": found, "reported": reported}, 120)
    assert re.search(r"^found-here +applied \(at import\) +found here$", text, re.M), text
    assert "    why: broken on 2.13, unfixed upstream" in text
    assert f"    changes: DTensor.f in {TARGET}" in text
    assert f"    PR text: {tmp_path.name}/0007-found-here.patch (not filed upstream yet)" in text
    assert re.search(r"^reported +upstream +pytorch#9$", text, re.M)
    assert "    why: fixed upstream in torch 2.13.0" in text
    assert text.count("PR text:") == 1


def test_narrow_terminal_moves_the_bug_under_the_row_and_wraps(tmp_path):
    patch = _patch(tmp_path, "a-rather-long-overlay-id-for-a-narrow-terminal", Origin="vendor", Affects="2.13.0")
    functions = ", ".join(f"Class.method_number_{i}" for i in range(30))
    bug = "https://github.com/pytorch/pytorch/issues/9"
    row = _row(patch.id, PatchState.APPLIED, f"x.patch: {functions}", bug=bug, variant="x.patch", mode="at import")
    text = format_status([row], {patch.id: patch}, 70)
    assert max(len(line) for line in text.splitlines()) <= 70
    assert "    bug: pytorch#9" in text and "BUG" not in text and "STATE" in text
    text = format_status([row], {patch.id: patch}, 60)
    assert max(len(line) for line in text.splitlines()) <= 60
    assert "    state: applied (at import)" in text and "STATE" not in text


def test_summary_counts_states_and_problems():
    rows = [
        _row("a", PatchState.APPLIED, ""),
        _row("b", PatchState.APPLIED, ""),
        _row("c", PatchState.UPSTREAM, ""),
        _row("d", PatchState.DRIFT, ""),
    ]
    assert status_summary(rows, 0) == "4 patches: 2 applied, 1 upstream, 1 drift; 1 problem"
    assert status_summary(rows[:3], 2) == "3 patches: 2 applied, 1 upstream; 2 problems"


def test_status_text_fits_the_terminal_and_ends_with_a_summary():
    proc = _cli("status", COLUMNS="80")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    too_long = [line for line in lines if len(line) > 80]
    assert too_long == []
    report = json.loads(_cli("status", "--json", "--lazy").stdout)
    assert re.fullmatch(rf"{len(report['patches'])} patches: \d+ applied, .*; 0 problems", lines[-1]), lines[-1]
    assert re.search(r"^    why: broken on 2\.\d+", proc.stdout, re.M)
    assert re.search(r"^    changes: ", proc.stdout, re.M)
    # A fix found here (no bug report, not a backport) says so and points at its PR text.
    found = [p for p in report["patches"] if not p["bug"]]
    for match in re.finditer(r"^    PR text: patches/(\S+)", proc.stdout, re.M):
        assert (REPO / "patches" / match.group(1)).is_file()
    assert not found or re.search(r"^    bug: found here$", proc.stdout, re.M)
    # What importing torch first would cost, measured in a fresh Python on this torch.
    order = " ".join(proc.stdout.split("import order: ", 1)[1].splitlines()[:-1]).split()
    order = " ".join(order)
    assert order.startswith("put `import torch_overlay` before `import torch`. A plain `import torch` imports ")
    swapped = re.search(r"\(([^()]*): changed functions swapped in\)", order)
    assert "torch.nn.utils.clip_grad" in order and swapped and "clip-grad-norm-mixed-meshes" in swapped.group(1), order
    # What a cold code cache costs, and the command that pays it ahead.
    assert "`python -m torch_overlay warm` compiles every patched module ahead" in " ".join(proc.stdout.split())
    # torch.utils.checkpoint: imported by `import torch` since 2.13, its fix changes module-level code.
    sac = next(p for p in report["patches"] if p["id"] == "sac-ignore-runtime-ops")
    if sac["state"] == "pending":
        assert "it costs sac-ignore-runtime-ops (imported too late)" in order, order
    # The CLI is no job: it says none of the job's lines.
    assert "fixes active" not in proc.stderr and " applied in this process" not in proc.stderr


def test_late_import_text_says_what_import_torch_first_costs():
    lost = {"imported_by_import_torch": ["torch.utils.checkpoint"], "lost": ["sac"], "swapped": ["clip"]}
    text = format_late_imports(lost)
    assert "imports torch.utils.checkpoint: imported first, it costs sac (imported too late) (clip: " in text
    none = format_late_imports(
        {"imported_by_import_torch": ["torch.nn.utils.clip_grad"], "lost": [], "swapped": ["clip"]}
    )
    assert "it costs no fix on this torch" in none and "torch's other patched modules" in none


def test_verify_ends_with_a_closing_count():
    from types import SimpleNamespace

    from torch_overlay.cli.main import closing_count
    from torch_overlay.cli.verify import VERDICTS

    fixed = SimpleNamespace(kind=VERDICTS[(False, True)][0])
    assert closing_count([fixed] * 28) == "28/28 fixed (bug present without the overlay, fixed with it)"
    mixed = [fixed, SimpleNamespace(kind=VERDICTS[(False, False)][0]), SimpleNamespace(kind=VERDICTS[(True, True)][0])]
    assert closing_count(mixed) == (
        "1/3 fixed (bug present without the overlay, fixed with it); 1 NOT FIXED, 1 not needed on this torch"
    )
