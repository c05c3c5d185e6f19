"""The catalogue's pages (docs/reference/) come from the data, and the README stays a front door:
short, with no count written by hand, every link leading somewhere."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from torch_overlay.known.catalogue import load_catalogue
from torch_overlay.tools.catalogue_pages import render_pages, run_catalogue

REPO = Path(__file__).resolve().parents[2]
README_LINES_AT_MOST = 150
# "43 fixes", "28/28 fixed", "of 41", "42 patches": figures that go stale as the series grows.
_HAND_COUNT = re.compile(r"\b\d+ (?:fixes|patches|reports|bugs)\b|\b\d+/\d+ fixed\b|\(of \d+\b")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def test_the_pages_equal_the_data():
    assert run_catalogue(REPO / "docs", REPO / "patches", check=True) == 0, (
        "run `python -m torch_overlay.tools catalogue` and commit docs/reference/"
    )


def test_every_fix_has_a_row_and_a_page_and_every_report_a_row():
    catalogue = load_catalogue(REPO / "patches")
    fixes = (REPO / "docs" / "reference" / "fixes.md").read_text(encoding="utf-8")
    looked_at = (REPO / "docs" / "reference" / "looked-at.md").read_text(encoding="utf-8")
    for bug in catalogue.fixes():
        assert f"[`{bug.id}`](fixes/{bug.id}.md)" in fixes, bug.id
        assert (REPO / "docs" / "reference" / "fixes" / f"{bug.id}.md").is_file(), bug.id
    for bug in catalogue.looked_at():
        assert f"(`{bug.id}`)" in looked_at, bug.id


def test_a_changed_field_or_a_removed_fix_is_caught_and_regenerated(tmp_path):
    patches, docs = tmp_path / "patches", tmp_path / "docs"
    shutil.copytree(REPO / "patches", patches)
    shutil.copytree(REPO / "docs", docs)
    assert run_catalogue(docs, patches, check=True) == 0
    first = sorted(patches.glob("0*.patch"))[0]
    first.write_text(first.read_text(encoding="utf-8").replace("Symptom: ", "Symptom: CHANGED "), encoding="utf-8")
    assert run_catalogue(docs, patches, check=True) == 1
    assert run_catalogue(docs, patches, check=False) == 0
    assert "CHANGED" in (docs / "reference" / "fixes.md").read_text(encoding="utf-8")
    # A page left behind by a fix that is no longer in the series is stale, and removed.
    orphan = docs / "reference" / "fixes" / "no-such-fix.md"
    orphan.write_text("old\n", encoding="utf-8")
    assert run_catalogue(docs, patches, check=True) == 1
    assert run_catalogue(docs, patches, check=False) == 0
    assert not orphan.exists()
    assert run_catalogue(docs, patches, check=True) == 0


def test_a_fix_page_carries_its_description_and_errors():
    pages = render_pages(load_catalogue(REPO / "patches"), set())
    page = pages["fixes/clip-grad-norm-mixed-meshes.md"]
    assert "## The error it prints" in page
    assert "## What was wrong, and the fix" in page
    assert "Overlay-Notes" not in page


def test_the_readme_is_a_short_front_door_without_hand_counts():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_LINES_AT_MOST
    assert not _HAND_COUNT.findall(readme), _HAND_COUNT.findall(readme)


def test_every_relative_link_of_the_docs_leads_somewhere():
    pages = [REPO / "README.md", REPO / "CONTRIBUTING.md", *(REPO / "docs").rglob("*.md")]
    broken = []
    for page in pages:
        for target in _LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("/"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken


def test_every_test_a_guarantee_names_exists():
    # docs/reference/reliability.md: each guarantee names the test that holds it; a renamed or
    # removed test would leave a guarantee that nothing holds.
    text = (REPO / "docs" / "reference" / "reliability.md").read_text(encoding="utf-8")
    defined = set()
    for path in (REPO / "tests").rglob("test_*.py"):
        defined.add(path.stem)
        defined.update(re.findall(r"^\s*def (test_\w+)", path.read_text(encoding="utf-8"), re.M))
    named = set(re.findall(r"\b(test_\w+)", text))
    # A name cut short in the text (`test_a_device_is_refused_at_once_...`) stands for those it starts.
    missing = sorted(n for n in named if not any(d == n or (n.endswith("_") and d.startswith(n)) for d in defined))
    assert named and not missing, missing
