"""``explain`` against errors that people really posted (tests/known/real_posts/, each with its
source link; copied verbatim, never written here): known bugs of the series or of "Looked at",
other torch errors and near misses (the same class or torch file, another cause).

Recall: of the posts of a known bug, those where ``explain`` names that bug (as known, or as
possibly that bug when the paste lacks the frame or class a signature asks for). Precision: of the
*known* answers (sure ones), those that are right; a "possibly" answer says that it is a guess and
is counted apart. The README states the figures this test holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from torch_overlay.known.catalogue import load_catalogue
from torch_overlay.known.explain import explain_log
from torch_overlay.known.signatures import KNOWN

REPO = Path(__file__).resolve().parents[2]
POSTS = REPO / "tests" / "known" / "real_posts"
CATALOGUE = load_catalogue(REPO / "patches")
RECALL_AT_LEAST = 0.85
PRECISION_AT_LEAST = 0.95


@dataclass(frozen=True)
class Post:
    name: str
    source: str
    expect: str | None
    text: str


def _read(path: Path) -> Post:
    head, sep, body = path.read_text(encoding="utf-8").partition("\n---\n")
    assert sep, f"{path.name}: no '---' line between the header and the post"
    fields = dict(line.split(": ", 1) for line in head.splitlines() if ": " in line)
    expect = fields["Expect"].strip()
    return Post(path.name, fields["Source"].strip(), None if expect == "none" else expect, body)


ALL = [_read(p) for p in sorted(POSTS.glob("*.txt"))]


def _answers(post: Post) -> tuple[set[str], set[str]]:
    """The ids ``explain`` names for ``post``: (known, possibly)."""
    known: set[str] = set()
    possibly: set[str] = set()
    for ex in explain_log(post.text, CATALOGUE, "2.13.0", env={}):
        for match in ex.matches:
            (known if match.confidence == KNOWN else possibly).add(match.bug.id)
    return known, possibly - known


def test_the_corpus_is_large_and_mixed_and_sourced():
    assert len(ALL) >= 40
    ids = {b.id for b in CATALOGUE.bugs}
    for post in ALL:
        assert post.source.startswith("https://"), post.name
        assert post.expect is None or post.expect in ids, f"{post.name}: unknown id {post.expect}"
    known = [p for p in ALL if p.expect]
    assert len(known) >= 20 and len(ALL) - len(known) >= 15


def test_recall_and_precision():
    rows = []
    hits = named_known = right_known = 0
    for post in ALL:
        known, possibly = _answers(post)
        if post.expect and post.expect in known | possibly:
            hits += 1
        named_known += len(known)
        right_known += len(known & {post.expect})
        rows.append(f"{post.name}: expect {post.expect}, known {sorted(known)}, possibly {sorted(possibly)}")
    posts_of_known_bugs = sum(1 for p in ALL if p.expect)
    recall = hits / posts_of_known_bugs
    precision = right_known / named_known if named_known else 1.0
    report = "\n".join(rows)
    assert recall >= RECALL_AT_LEAST, f"recall {recall:.2f} ({hits}/{posts_of_known_bugs}):\n{report}"
    assert precision >= PRECISION_AT_LEAST, f"precision {precision:.2f} ({right_known}/{named_known}):\n{report}"


@pytest.mark.parametrize("post", [p for p in ALL if p.expect is None], ids=lambda p: p.name)
def test_other_errors_are_never_called_a_known_bug(post):
    known, _ = _answers(post)
    assert not known, f"{post.name} ({post.source}) is not a bug of the catalogue, but explain says {known}"
