"""The conformance record (docs/measurements/conformance.toml) has a row for every torch file the
series changes, and its page is generated from it."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

from torch_overlay.series.series import read_series
from torch_overlay.tools.conformance import (
    PAGE,
    RECORD,
    _write_record,
    changed_files,
    check_record,
    load_record,
    render,
    run_check,
)

REPO = Path(__file__).resolve().parents[2]


def test_every_changed_torch_file_has_a_row_and_the_page_is_current():
    patches = read_series(REPO / "patches")
    assert check_record(load_record(REPO / RECORD), patches) == []
    assert run_check(REPO, REPO / "patches", write=False) == 0, "run `python -m torch_overlay.tools conformance`"


def test_a_file_without_a_row_a_row_without_a_reason_and_a_stray_run_are_problems(tmp_path):
    patches = read_series(REPO / "patches")
    record = load_record(REPO / RECORD)
    dropped = record["file"].pop(0)["torch"]
    record["file"][0] = {"torch": record["file"][0]["torch"], "upstream": []}
    record["run"].append({"upstream": "test/nowhere.py", "torch": "2.11.0"})
    problems = check_record(record, patches)
    assert any(p.startswith(f"{dropped}: changed by") for p in problems), problems
    assert any("names no upstream test" in p for p in problems), problems
    assert any("test/nowhere.py" in p and "no [[file]] row" in p for p in problems), problems
    assert any("lacks commit" in p for p in problems), problems


def _record_copy_with_run(tmp_path: Path, outcomes: dict, time_ratio: float | None, reach: dict) -> tuple[Path, dict]:
    """A copy of the record in a scratch repo, a run of clip_grad.py's first upstream file on 2.11.0
    added and written back: the record's path and the run."""
    root = tmp_path / "repo"
    (root / RECORD.parent).mkdir(parents=True)
    shutil.copy(REPO / RECORD, root / RECORD)
    record = load_record(root / RECORD)
    row = next(r for r in record["file"] if r["torch"] == "torch/nn/utils/clip_grad.py")
    run = {
        "upstream": row["upstream"][0],
        "torch": "2.11.0",
        "commit": "0123456789abcdef",
        "select": "",
        "measured": "2026-12-02",
        "without": outcomes,
        "with": dict(outcomes),
        "differences": [],
        "time_ratio": time_ratio,
        "reach": reach,
    }
    record["run"].append(run)
    _write_record(root / RECORD, record)
    return root / RECORD, run


def test_a_run_is_written_back_and_shown(tmp_path):
    patches = read_series(REPO / "patches")
    outcomes = {"pass": 3, "fail": 0, "error": 0, "skipped": 1}
    path, run = _record_copy_with_run(tmp_path, outcomes, 1.01, {"clip-grad-norm-mixed-meshes": 3})
    with open(path, "rb") as f:
        again = tomllib.load(f)
    assert again["run"][-1] == run
    assert again["file"] == load_record(REPO / RECORD)["file"]
    page = render(load_record(path), patches)
    assert "`clip-grad-norm-mixed-meshes` 3" in page
    assert "| 3 / 0 / 0 / 1 | 3 / 0 / 0 / 1 | none | x1.01 |" in page
    assert (REPO / PAGE).is_file()


def test_a_run_with_no_time_ratio_is_written_without_it(tmp_path):
    # compare gives no ratio when no test passes both ways (a file whose every test errors or skips)
    path, _ = _record_copy_with_run(tmp_path, {"pass": 0, "fail": 0, "error": 1, "skipped": 0}, None, {})
    with open(path, "rb") as f:
        again = tomllib.load(f)
    assert "time_ratio" not in again["run"][-1]
    page = render(load_record(path), read_series(REPO / "patches"))
    assert "| 0 / 0 / 1 / 0 | 0 / 0 / 1 / 0 | none | — |" in page


def test_changed_files_name_every_fix_that_changes_them():
    files = changed_files(read_series(REPO / "patches"))
    assert "clip-grad-norm-mixed-meshes" in files["torch/nn/utils/clip_grad.py"]
    assert {"dtensor-new-empty-partial", "dtensor-new-factory-shard-partial"} <= set(
        files["torch/distributed/tensor/_ops/_tensor_ops.py"]
    )


def test_a_row_is_measured_only_when_each_of_its_upstream_files_ran_on_both_ends():
    patches = read_series(REPO / "patches")
    record = load_record(REPO / RECORD)
    record["run"] = []
    row = {"torch": "torch/nn/utils/clip_grad.py", "upstream": ["test/a_test.py", "test/b_test.py"]}
    record["file"] = [row if r["torch"] == row["torch"] else r for r in record["file"]]
    record["run"] = [
        {
            "upstream": "test/a_test.py",
            "torch": release,
            "commit": "0" * 40,
            "measured": "2026-12-02",
            "without": {},
            "with": {},
        }
        for release in ("2.11.0", "2.15.0")
    ]
    line = next(
        line for line in render(record, patches).splitlines() if line.startswith("| `torch/nn/utils/clip_grad.py`")
    )
    assert "**not yet**: `b_test.py` on 2.11.0, 2.15.0" in line, line
    record["run"] += [dict(run, upstream="test/b_test.py") for run in record["run"]]
    line = next(
        line for line in render(record, patches).splitlines() if line.startswith("| `torch/nn/utils/clip_grad.py`")
    )
    assert line.endswith("| on 2.11.0, 2.15.0 |"), line
    record["run"] = [r for r in record["run"] if (r["upstream"], r["torch"]) != ("test/b_test.py", "2.11.0")]
    line = next(
        line for line in render(record, patches).splitlines() if line.startswith("| `torch/nn/utils/clip_grad.py`")
    )
    assert "**not yet**: `b_test.py` on 2.11.0 |" in line, line  # only the end it lacks


def test_the_page_says_per_fix_how_many_upstream_tests_reached_it_or_names_its_own_test():
    patches = read_series(REPO / "patches")
    record = load_record(REPO / RECORD)
    fix = next(p for p in patches if p.main is not None and p.main.fields.get("Quick-Test"))
    record["run"] = [
        {
            "upstream": "test/a_test.py",
            "torch": "2.11.0",
            "commit": "0" * 40,
            "without": {},
            "with": {},
            "reach": {fix.id: 7},
        }
    ]
    page = render(record, patches)
    assert f"| `{fix.id}` | 7 (`a_test.py` on 2.11.0) |" in page
    other = next(p for p in patches if p.main is not None and p.id != fix.id and p.main.fields.get("Quick-Test"))
    own = other.main.fields["Quick-Test"].strip()
    assert f"| `{other.id}` | none yet | `{own}` |" in page
    assert f"Fixes no recorded upstream test reached: {sum(1 for p in patches if p.main is not None) - 1}." in page


def test_a_regression_without_a_why_is_a_problem_and_with_one_is_counted_as_explained(tmp_path):
    patches = read_series(REPO / "patches")
    path, run = _record_copy_with_run(tmp_path, {"pass": 1, "fail": 1, "error": 0, "skipped": 0}, 1.0, {})
    record = load_record(path)
    explained = sum(1 for r in record["run"] for d in r.get("differences", []) if d.get("regression"))
    diff = {"test": "test_x.T::test_y", "without": "pass", "with": "fail", "regression": True}
    record["run"][-1]["differences"] = [diff]
    assert any("test_y passes without the overlay and fails with it" in p for p in check_record(record, patches))
    assert "; **unexplained: 1**" in render(record, patches)
    diff["why"] = "upstream's own behaviour from 2.12 on, measured on stock 2.12.1"
    assert not [p for p in check_record(record, patches) if "test_y" in p]
    assert f"each with a why in its run below: {explained + 1}." in render(
        record, patches
    ) and "unexplained" not in render(record, patches)


def test_a_flagged_slowdown_is_shown_with_its_cpu_pairs_and_why_or_as_not_yet_explained(tmp_path):
    patches = read_series(REPO / "patches")
    path, run = _record_copy_with_run(tmp_path, {"pass": 2, "fail": 0, "error": 0, "skipped": 0}, 1.5, {})
    record = load_record(path)
    flagged = sum(len(r.get("slowdowns", [])) for r in record["run"])
    unexplained = sum(1 for r in record["run"] for s in r.get("slowdowns", []) if not s.get("why"))
    slow = {"test": "test_x.T::test_slow", "without": 10.0, "with": 20.0}
    record["run"][-1]["slowdowns"] = [slow]
    page = render(record, patches)
    assert "| test_slow | 10.0 s -> 20.0 s | not re-measured | **not yet explained** |" in page
    assert f"Flagged slowdowns not yet explained: {unexplained + 1} of {flagged + 1}." in page
    slow.update(cpu=[[10.0, 10.5], [8.0, 8.0]], why="noise: CPU x1.05 and x1.00")
    _write_record(path, record)
    again = load_record(path)["run"][-1]["slowdowns"][0]
    assert again["cpu"] == [[10.0, 10.5], [8.0, 8.0]] and again["why"] == slow["why"]
    page = render(load_record(path), patches)
    assert "| test_slow | 10.0 s -> 20.0 s | x1.05, x1.00 | noise: CPU x1.05 and x1.00 |" in page
    assert f"Flagged slowdowns not yet explained: {unexplained} of {flagged + 1}." in page


def test_a_rerun_keeps_what_re_measuring_a_test_flagged_again_found(tmp_path, monkeypatch):
    from torch_overlay.tools import conformance

    root = tmp_path / "repo"
    (root / RECORD.parent).mkdir(parents=True)
    shutil.copy(REPO / RECORD, root / RECORD)
    record = load_record(root / RECORD)
    old = next(r for r in record["run"] if r.get("slowdowns") and r["select"] == "")
    kept = old["slowdowns"][0]
    assert kept.get("why") and kept.get("cpu")
    local = tmp_path / "test" / Path(old["upstream"]).relative_to("test")
    local.parent.mkdir(parents=True)
    local.write_text("")
    result = {k: old[k] for k in ("without", "with", "differences", "time_ratio", "reach")}
    again = {"test": kept["test"], "without": 1.0, "with": 3.0}
    new = {"test": "test_x.T::test_new", "without": 1.0, "with": 3.0}
    result["slowdowns"] = [again, new]
    monkeypatch.setattr(conformance, "_compare", lambda *a: result)
    monkeypatch.setattr(conformance, "run_check", lambda *a, **k: 0)
    only = {r["torch"] for r in record["file"] if old["upstream"] in r.get("upstream", [])}
    conformance.run_conformance(root, REPO / "patches", tmp_path / "test", only, 60.0)
    rerun = next(
        r for r in load_record(root / RECORD)["run"] if (r["upstream"], r["torch"]) == (old["upstream"], old["torch"])
    )
    first, second = rerun["slowdowns"]
    assert (first["with"], first["cpu"], first["why"]) == (3.0, kept["cpu"], kept["why"])
    assert "why" not in second and "cpu" not in second


def test_a_fix_a_run_applied_without_counting_is_not_countable_not_unreached():
    patches = read_series(REPO / "patches")
    record = load_record(REPO / RECORD)
    fixes = [p for p in patches if p.main is not None]
    table_only, reached = fixes[0], fixes[1]
    run = {"upstream": "test/a_test.py", "torch": "2.11.0", "commit": "0" * 40, "without": {}, "with": {}}
    record["run"] = [{**run, "reach": {reached.id: 2}, "uncounted": [table_only.id]}]
    page = render(record, patches)
    assert f"| `{table_only.id}` | not countable (definitions only) |" in page
    assert f"| `{reached.id}` | 2 (`a_test.py` on 2.11.0) |" in page
    assert f"Fixes no recorded upstream test reached: {len(fixes) - 2}." in page
    assert "Fixes applied in a recorded run but not countable: 1." in page


def test_reach_counted_at_import_before_the_fix_date_is_left_out_of_the_per_fix_table(tmp_path):
    patches = read_series(REPO / "patches")
    record = load_record(REPO / RECORD)
    fix = next(p for p in patches if p.main is not None)
    record["reach_at_import"] = {"until": "2026-12-04", "fixes": [fix.id]}
    run = {"upstream": "test/a_test.py", "torch": "2.11.0", "commit": "0" * 40, "without": {}, "with": {}}
    record["run"] = [{**run, "measured": "2026-12-02", "reach": {fix.id: 9}}]
    page = render(record, patches)
    assert f"| `{fix.id}` | none yet |" in page and f"`{fix.id}` 9" in page  # the Runs table keeps it
    assert "Runs measured before 2026-12-04 counted the runs" in page
    record["run"].append({**run, "upstream": "test/b_test.py", "measured": "2026-12-04", "reach": {fix.id: 2}})
    assert f"| `{fix.id}` | 2 (`b_test.py` on 2.11.0) |" in render(record, patches)
    # and the record keeps the table when it is written back
    path = tmp_path / "conformance.toml"
    path.write_text((REPO / RECORD).read_text(encoding="utf-8"), encoding="utf-8")
    _write_record(path, record)
    assert load_record(path)["reach_at_import"] == record["reach_at_import"]
