"""Error signatures: the forms of an ``Error:`` line and what each matches."""

from __future__ import annotations

import pytest

from torch_overlay.known.signatures import ErrorText, parse_signature, SignatureError

TANGENT = ErrorText(
    "RuntimeError: Node tangents_1 was invalid,\n  but is output",
    ("RuntimeError",),
    ('File "/site/torch/_functorch/_aot_autograd/runtime_wrappers.py", line 9, in backward',),
)


def test_fragment_matches_across_whitespace_and_nothing_else():
    sig = parse_signature("Node tangents_1 was invalid, but is output")
    assert sig.matches(TANGENT)
    assert not sig.matches(ErrorText("RuntimeError: Node tangents_2 was invalid, but is output"))


def test_fragment_is_literal():
    sig = parse_signature("sizes [16, 8] (x)")
    assert sig.matches(ErrorText("RuntimeError: sizes [16, 8] (x) are out of bounds"))
    assert not sig.matches(ErrorText("RuntimeError: sizes 1 (x)"))


def test_regex():
    sig = parse_signature(r"re:Node \w+ was invalid, but is output")
    assert sig.matches(TANGENT)
    assert not sig.matches(ErrorText("RuntimeError: Node was valid"))


def test_frame_and_type_qualifiers():
    assert parse_signature("was invalid | frame=runtime_wrappers").matches(TANGENT)
    assert not parse_signature("was invalid | frame=checkpoint.py").matches(TANGENT)
    assert parse_signature("was invalid | type=RuntimeError").matches(TANGENT)
    assert not parse_signature("was invalid | type=ValueError").matches(TANGENT)
    both = parse_signature("was invalid | type=RuntimeError | frame=in backward")
    assert both.matches(TANGENT)


@pytest.mark.parametrize("line", ["", "re:", "re:(unclosed", "text | where=x", "text | frame="])
def test_malformed_signatures_are_refused(line):
    with pytest.raises(SignatureError):
        parse_signature(line)
