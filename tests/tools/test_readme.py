"""The README's tables of fixes and of looked-at reports come from the data: they cannot drift."""

from __future__ import annotations

import shutil
from pathlib import Path

from torch_overlay.known.catalogue import load_catalogue
from torch_overlay.tools.readme import render, run_readme

REPO = Path(__file__).resolve().parents[2]


def test_readme_tables_equal_the_data():
    assert run_readme(REPO / "README.md", REPO / "patches", check=True) == 0, (
        "run `python -m torch_overlay.tools readme` and commit the README"
    )


def test_every_fix_and_report_has_a_row():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for bug in load_catalogue(REPO / "patches").bugs:
        assert f"`{bug.id}`" in readme, bug.id


def test_a_changed_field_changes_the_table(tmp_path):
    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches)
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- BEGIN generated: fixes -->\nstale\n<!-- END generated: fixes -->\ny\n", encoding="utf-8")
    assert run_readme(readme, patches, check=True) == 1
    assert run_readme(readme, patches, check=False) == 0
    assert run_readme(readme, patches, check=True) == 0
    first = sorted(patches.glob("0*.patch"))[0]
    first.write_text(first.read_text().replace("Symptom: ", "Symptom: CHANGED "), encoding="utf-8")
    assert run_readme(readme, patches, check=True) == 1
    assert "CHANGED" in render(readme.read_text(), load_catalogue(patches), set())
