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


@pytest.mark.parametrize("line", ["", "re:", "re:(unclosed", "text | where=x", "text | frame=", "text | unless=("])
def test_malformed_signatures_are_refused(line):
    with pytest.raises(SignatureError):
        parse_signature(line)


def test_known_or_possibly_by_what_the_error_shows():
    from torch_overlay.known.signatures import KNOWN, POSSIBLY

    sig = parse_signature("was invalid | frame=runtime_wrappers")
    assert sig.match(TANGENT) == KNOWN
    assert sig.match(ErrorText("RuntimeError: Node x was invalid", ("RuntimeError",))) == POSSIBLY  # no frames
    torch_frame = 'File "/site/torch/_functorch/partitioners.py", line 1, in f'
    assert sig.match(ErrorText("RuntimeError: was invalid", ("RuntimeError",), (torch_frame,))) is None
    # Only the user's frames (a cut traceback): the paste cannot tell.
    user_frame = 'File "a.py", line 1, in f'
    assert sig.match(ErrorText("RuntimeError: was invalid", ("RuntimeError",), (user_frame,))) == POSSIBLY
    typed = parse_signature("was invalid | type=RuntimeError")
    assert typed.match(ErrorText("Node x was invalid")) == POSSIBLY  # pasted without its class
    assert typed.match(ErrorText("ValueError: was invalid", ("ValueError",))) is None


def test_a_generic_message_is_at_most_possibly_and_needs_its_qualifiers():
    from torch_overlay.known.signatures import POSSIBLY

    sig = parse_signature("was invalid | frame=runtime_wrappers | possibly")
    assert sig.match(TANGENT) == POSSIBLY and not sig.matches(TANGENT)
    assert sig.match(ErrorText("RuntimeError: Node x was invalid", ("RuntimeError",))) is None
    assert parse_signature("was invalid | possibly").match(TANGENT) == POSSIBLY


def test_unless_another_cause_shows_the_answer_is_a_guess():
    from torch_overlay.known.signatures import KNOWN, POSSIBLY

    # SAC rejecting a runtime op (what the fix covers) and, in the same text, a compute op (what it
    # does not): the recomputation diverged for another reason too.
    sig = parse_signature(r"re:fsdp\.\w+\.default encountered during backward | unless=aten\.\w+\.\w+ encountered")
    runtime = "RuntimeError: fsdp.all_gather_copy_in.default encountered during backward but not found in storage"
    assert sig.match(ErrorText(runtime, ("RuntimeError",))) == KNOWN
    both = runtime + "\n\naten.empty.memory_format encountered\nduring backward but not found in storage"
    assert sig.match(ErrorText(both, ("RuntimeError",))) == POSSIBLY
    assert parse_signature("was invalid | unless=tangents_\\d").match(TANGENT) == POSSIBLY


def test_a_message_quoted_in_a_code_comment_and_wrapped_there():
    sig = parse_signature("is shared with a parameter already managed by another FSDP group")
    comment = "# dies with\n# \"Parameter 'w' is shared with a parameter already managed by another\n# FSDP group\"\n"
    assert sig.matches(ErrorText(comment))
    assert sig.matches(ErrorText(comment.replace("# ", "// ")))
    assert not sig.matches(ErrorText(comment.replace("another\n# FSDP", "another\n# DDP")))


def test_a_frame_of_the_same_file_is_a_near_fit():
    from torch_overlay.known.signatures import KNOWN, POSSIBLY

    sig = parse_signature("was invalid | frame=_functorch/partitioners.py:solve_min_cut")
    frame = 'File "/site/torch/_functorch/partitioners.py", line 9, in {}'
    assert sig.match(ErrorText("RuntimeError: was invalid", (), (frame.format("solve_min_cut"),))) == KNOWN
    # torch renamed or moved the function: another function of the same file is possibly the bug.
    renamed = frame.format("min_cut_rematerialization")
    assert sig.match(ErrorText("RuntimeError: was invalid", (), (renamed,))) == POSSIBLY
    other = 'File "/site/torch/_inductor/graph.py", line 9, in solve'
    assert sig.match(ErrorText("RuntimeError: was invalid", (), (other,))) is None


@pytest.mark.parametrize(
    "text",
    [
        "RuntimeError: fsdp.all_gather_copy_in.default invocation index ... encountered during backward",
        "RuntimeError: fsdp.all_gather_copy_in.default invocation index … encountered during backward",
        "RuntimeError: fsdp.all_gather_copy_in.default invocation index 3 encountered during backw\n  ard",
    ],
)
def test_elided_numbers_and_words_wrapped_mid_word(text):
    sig = parse_signature(r"re:fsdp\.all_gather_copy_in\.default invocation index \d+ encountered during backward")
    assert sig.matches(ErrorText(text, ("RuntimeError",)))
    named = "RuntimeError: fsdp.all_gather_copy_in.default invocation index x encountered"
    assert not sig.matches(ErrorText(named, ("RuntimeError",)))


GRAD_DTYPE = r"re:attempting to assign a gradient with dtype '[^']+' to a tensor with (grad_)?dtype '[^']+'"


@pytest.mark.parametrize(
    "text",
    [
        # retold with other quote marks, or none
        'dies with "attempting to assign a gradient with dtype BFloat16 to a tensor with grad_dtype Float" inside',
        'RuntimeError: attempting to assign a gradient with dtype "c10::BFloat16" to a tensor with grad_dtype "Float"',
        # cut short where the paste stops quoting it: a closing quote, an ellipsis, the end of the text
        "would fail outright with\n  \"attempting to assign a gradient with dtype 'c10::BFloat16'\".",
        "RuntimeError: attempting to assign a gradient with dtype 'c10::BFloat16' to a tensor ...",
        "RuntimeError: attempting to assign a gradient with dtype 'c10::BFloat16' to a",
    ],
)
def test_a_near_fit_of_the_message_is_possibly_at_most(text):
    from torch_overlay.known.signatures import POSSIBLY

    torch_frame = 'File "/site/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", line 9, in foreach_reduce'
    sig = parse_signature(f"{GRAD_DTYPE} | frame=_fsdp_collectives.py:foreach_reduce")
    assert not sig.text_matches(ErrorText(text))
    assert sig.match(ErrorText(text, ("RuntimeError",), (torch_frame,))) == POSSIBLY  # even with its frame
    assert parse_signature(f"{GRAD_DTYPE} | possibly").match(ErrorText(text)) is None  # a generic message: nothing


@pytest.mark.parametrize(
    "text",
    [
        # the start of the message, then other words: not a cut, another message
        "RuntimeError: attempting to assign a gradient with dtype 'c10::BFloat16' when the hook ran",
        "attempting to assign a gradient with dtype 'c10::Half' to a parameter of another size",
        # fewer than five of its words
        "RuntimeError: attempting to assign a",
        # a near fit whose frames contradict the qualifier
    ],
)
def test_what_is_not_a_near_fit(text):
    sig = parse_signature(f"{GRAD_DTYPE} | frame=_fsdp_collectives.py:foreach_reduce")
    assert sig.match(ErrorText(text)) is None


def test_a_near_fit_still_obeys_its_qualifiers():
    sig = parse_signature(f"{GRAD_DTYPE} | frame=_fsdp_collectives.py:foreach_reduce")
    other = 'File "/site/torch/autograd/graph.py", line 9, in _engine_run_backward'
    text = "RuntimeError: attempting to assign a gradient with dtype BFloat16 to a tensor with grad_dtype Float"
    assert sig.match(ErrorText(text, ("RuntimeError",), (other,))) is None


def _catalogue_signatures():
    from pathlib import Path

    from torch_overlay.known.catalogue import load_catalogue

    repo = Path(__file__).resolve().parents[2]
    return [sig for bug in load_catalogue(repo / "patches").bugs for sig in bug.signatures]


def test_near_fits_compile_and_reach_a_bounded_length():
    # A near fit with an unbounded repeat would scan a whole log at each place its first words occur.
    import re

    from torch_overlay.known.signatures import _regex_tokens

    for sig in _catalogue_signatures():
        for source, _ in sig.near_patterns + sig.cut_patterns:
            re.compile(source)
            assert not [t for _, t, _ in _regex_tokens(source) if t in ("+", "*")], (sig.source, source)


def test_an_anchor_is_in_every_text_its_pattern_matches():
    # The anchor lets a search skip a text (a megabytes-long log); it must never skip a match.
    import re
    from pathlib import Path

    posts = Path(__file__).resolve().parent / "real_posts"
    texts = [p.read_text(encoding="utf-8").partition("\n---\n")[2] for p in sorted(posts.glob("*.txt"))]
    texts += [" ".join(t.split()) for t in texts]
    checked = 0
    for sig in _catalogue_signatures():
        for pattern, anchor in [*sig.exact_patterns, *sig.near_patterns, *sig.cut_patterns]:
            if anchor is None:
                continue
            for text in texts:
                if re.search(pattern, text):
                    assert anchor in text, (sig.source, anchor)
                    checked += 1
    assert checked > 100
