import hypothesis
import hypothesis.strategies as st
import pytest

from torch_overlay.series.patchfile import parse_patch, PatchParseError
from torch_overlay.series.series import read_series

from tests.engine._fixtures import make_diff, make_patch

OLD = "def f():\n    return 1\n"
NEW = "def f():\n    return 2\n"


def test_fields_description_and_hunks(tmp_path):
    text = make_patch(
        "some-fix",
        [make_diff("torch/a.py", OLD, NEW), make_diff("torch/b/__init__.py", OLD, NEW)],
        subject="[DTensor] do the thing",
        Applied_Upstream="2.13.0",
    )
    patch = parse_patch(tmp_path / "x.patch", text)
    assert patch.id == "some-fix"
    assert patch.title == "[DTensor] do the thing"
    assert patch.fields["Applied-Upstream"] == "2.13.0"
    assert patch.description == "Test fixture."
    assert [d.path for d in patch.files] == ["torch/a.py", "torch/b/__init__.py"]
    assert [d.target.module for d in patch.files] == ["torch.a", "torch.b"]
    (hunk,) = patch.files[0].hunks
    assert hunk.side() == (["def f():", "    return 1"], ["def f():", "    return 2"])
    assert hunk.side(reverse=True) == (["def f():", "    return 2"], ["def f():", "    return 1"])


def test_silent_is_a_field_not_upstream_text(tmp_path):
    """``Silent:`` (what a run without the fix does) is read as a field: never part of the summary
    that ``stage`` sends upstream."""
    text = make_patch("some-fix", [make_diff("torch/a.py", OLD, NEW)], Silent="gradients reduced in bf16")
    patch = parse_patch(tmp_path / "x.patch", text)
    assert patch.fields["Silent"] == "gradients reduced in bf16"
    assert "bf16" not in patch.description


@pytest.mark.parametrize(
    "mutate, message, line",
    [
        (lambda t: t.replace("Overlay-Id: some-fix\n", ""), "no 'Overlay-Id:'", None),
        (lambda t: t.replace("Subject: [PATCH] fix\n", ""), "no 'Subject:'", 1),
        (lambda t: t.replace("@@ -1,2 +1,2 @@", "@@ -1,5 +1,2 @@"), "unexpected line in hunk", None),
        (lambda t: t.replace("+++ b/torch/a.py", "+++ b/torch/c.py"), "renames are not supported", None),
        (lambda t: t.replace("--- a/torch/a.py", "--- a/setup.py"), "outside the torch/ tree", None),
        (
            lambda t: (
                t.replace("     return", "?    return", 1)
                if "     return" in t
                else t.replace("-    return 1", "?    return 1")
            ),
            "unexpected line",
            None,
        ),
    ],
)
def test_malformed_patch_names_file_and_line(tmp_path, mutate, message, line):
    text = mutate(make_patch("some-fix", [make_diff("torch/a.py", OLD, NEW)]))
    path = tmp_path / "0001-some-fix.patch"
    with pytest.raises(PatchParseError, match=message) as info:
        parse_patch(path, text)
    assert str(info.value).startswith(f"{path}:")
    assert info.value.lineno >= 1
    if line is not None:
        assert info.value.lineno == line


def test_series_keeps_going_after_a_malformed_patch(tmp_path):
    good = make_patch("good-fix", [make_diff("torch/a.py", OLD, NEW)])
    (tmp_path / "0001-bad-fix.patch").write_text("Subject: x\n\nnothing here\n")
    (tmp_path / "0002-good-fix.patch").write_text(good)
    (tmp_path / "0002-good-fix@2.14.patch").write_text(good.replace("Bug:", "Torch-Versions: >=2.14\nBug:"))
    (tmp_path / "series").write_text(
        "# comment\n0001-bad-fix.patch\n0002-good-fix.patch\n0002-good-fix@2.14.patch\n0003-missing.patch\n"
    )
    patches = read_series(tmp_path)
    assert [p.id for p in patches] == ["bad-fix", "good-fix", "missing"]
    assert "0001-bad-fix.patch" in patches[0].error
    assert patches[1].error is None and len(patches[1].variants) == 2
    assert [v.path.name for v in patches[1].ordered_variants("2.14.1")] == [
        "0002-good-fix@2.14.patch",
        "0002-good-fix.patch",
    ]
    assert "does not exist" in patches[2].error


def _by_lines(text):
    """The message parsed line by line, as a reader of the format would: the reference."""
    from torch_overlay.series.patchfile import KNOWN_FIELDS, NOTES_MARK

    lines = text.splitlines()
    i, subject = 0, ""
    while i < len(lines) and lines[i]:
        if lines[i].startswith("Subject:"):
            subject = lines[i][len("Subject:") :].strip()
            while i + 1 < len(lines) and lines[i + 1][:1] in (" ", "\t") and lines[i + 1].strip():
                i += 1
                subject += " " + lines[i].strip()
        i += 1
    fields, description, notes = {}, [], None
    while i < len(lines) and lines[i] != "---" and not lines[i].startswith("diff --git "):
        name, sep, value = lines[i].partition(":")
        if notes is not None:
            notes.append(lines[i])
        elif lines[i].startswith(NOTES_MARK):
            notes = [lines[i][len(NOTES_MARK) :].strip()]
        elif sep and name in KNOWN_FIELDS:
            fields[name] = value.removeprefix(" ").strip()
        else:
            description.append(lines[i])
        i += 1
    return subject, fields, "\n".join(description).strip(), "\n".join(notes).strip() if notes else "", i


_MESSAGE_LINES = st.one_of(
    st.sampled_from(["Bug: https://x/1", "Affects: 2.11", "Test-Select: a b", "Test: t.py", "Introduced:2.12"]),
    st.sampled_from(
        ["Not-A-Field: x", "Bugs: no", " Bug: indented", "", "text", "--- not the end", "Overlay-Notes: n"]
    ),
    st.text(alphabet="ab :-\t", max_size=12),
)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    subject=st.lists(st.text(alphabet="ab [].", min_size=1, max_size=8), min_size=1, max_size=3),
    message=st.lists(_MESSAGE_LINES, max_size=12),
    separator=st.booleans(),
)
def test_the_message_parses_as_a_line_by_line_reader_reads_it(tmp_path_factory, subject, message, separator):
    head = f"From 0 Mon Sep 17 00:00:00 2001\nSubject: {subject[0]}\n" + "".join(f" {s}\n" for s in subject[1:])
    body = "".join(f"{line}\n" for line in ["Overlay-Id: some-fix", *message])
    text = head + "\n" + body + ("---\n" if separator else "") + make_diff("torch/a.py", OLD, NEW)
    expected = _by_lines(text)
    hypothesis.assume(expected[0] and expected[1].get("Overlay-Id") == "some-fix")
    patch = parse_patch(tmp_path_factory.mktemp("p") / "x.patch", text, lazy=True)
    assert (patch.subject, patch.fields, patch.description, patch.overlay_notes, patch.diff_start) == expected
    assert patch.paths == ("torch/a.py",)
