"""Every ``Error:`` line (and looked-at ``errors`` entry) is backed by text that torch really printed.

A signature written by hand and never matched against real text is a guess: one of
``clip-grad-norm-mixed-meshes`` expected ``aten._foreach_norm.Scalar got mixed ...`` where torch
prints ``aten._foreach_norm.Scalar: got mixed ...``, and no real post of that bug matched it. The
real texts are what the fixes' reproducers raised on each release (``patches/captured/``), the
posts of ``tests/known/real_posts/`` (near misses count: they show what torch prints), and
torch's own messages (``tests/known/torch_messages.toml``), each checked here against the
installed torch's source or library.
"""

from __future__ import annotations

import json
import mmap
import os
import tomllib
from functools import cache
from pathlib import Path

import pytest
import torch

from torch_overlay.known.catalogue import load_catalogue
from torch_overlay.known.logparse import find_errors, message_only
from torch_overlay.known.signatures import ErrorText

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = load_catalogue(REPO / "patches")
MESSAGES = tomllib.loads((REPO / "tests" / "known" / "torch_messages.toml").read_text(encoding="utf-8"))["message"]
TORCH_ROOT = Path(torch.__file__).resolve().parents[1]
RELEASE = ".".join(torch.__version__.split("+")[0].split(".")[:2])
# Older releases' wordings are checked against unpacked wheels of those releases: a folder holding
# <release>/torch/... for each (e.g. 2.6/torch/_functorch/aot_autograd.py), where this names one.
TORCH_TREES = os.environ.get("TORCH_OVERLAY_TORCH_TREES")
SUPPORTED = ("2.11", "2.12", "2.13", "2.14", "2.15")


def _errors(text: str) -> list[ErrorText]:
    """Each error of ``text`` as a signature sees it, and the whole text as one message."""
    return [e.as_error_text() for e in find_errors(text) + [e for e in [message_only(text)] if e is not None]]


@cache
def real_texts() -> list[tuple[str, list[ErrorText]]]:
    texts = []
    for path in sorted((REPO / "patches" / "captured").glob("*.json")):
        for pid, entry in json.loads(path.read_text(encoding="utf-8"))["fixes"].items():
            if entry.get("text"):
                texts.append((f"captured {path.stem} {pid}", entry["text"]))
    for path in sorted((REPO / "tests" / "known" / "real_posts").glob("*.txt")):
        texts.append((f"post {path.name}", path.read_text(encoding="utf-8").partition("\n---\n")[2]))
    for n, message in enumerate(MESSAGES, 1):
        texts.append((f"torch_messages.toml message {n}", message["text"]))
    return [(name, _errors(text)) for name, text in texts]


def test_every_error_line_is_matched_by_real_text():
    unbacked = [
        f"{bug.id}: {sig.source}"
        for bug in CATALOGUE.bugs
        for sig in bug.signatures
        if not any(sig.text_matches(error) for _, errors in real_texts() for error in errors)
    ]
    assert not unbacked, (
        "Error: lines that no capture, real post or torch message matches (a line torch never printed "
        "is a guess: quote torch's message, or add the text it prints to tests/known/torch_messages.toml):\n"
        + "\n".join(unbacked)
    )


@cache
def _installed(file: str) -> bytes | mmap.mmap:
    with open(TORCH_ROOT / file, "rb") as handle:
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


@pytest.mark.parametrize(
    "message", MESSAGES, ids=lambda m: f"{m['text'].split(':', 1)[0]} {m['file'].rsplit('/', 1)[-1]}"
)
def test_each_torch_message_is_in_the_installed_torch(message):
    if RELEASE not in message["releases"]:
        pytest.skip(f"{message['file']}: not said to hold this message on torch {RELEASE}")
    missing = [piece for piece in message["pieces"] if _installed(message["file"]).find(piece.encode()) < 0]
    assert not missing, f"torch {torch.__version__} has no {missing} in {message['file']}: the message changed"


def test_each_torch_message_is_explained():
    # A message kept here for a signature must also be read as an error by explain's parser.
    for message in MESSAGES:
        assert _errors(message["text"]), message["text"]


OLDER = [(m, r) for m in MESSAGES for r in m["releases"] if r not in SUPPORTED]


@pytest.mark.parametrize(
    "message, release", OLDER, ids=lambda x: x if isinstance(x, str) else x["file"].rsplit("/", 1)[-1]
)
def test_each_older_wording_is_in_that_release(message, release):
    # No CI installs these releases: where TORCH_OVERLAY_TORCH_TREES names unpacked wheels, the
    # message's pieces must be in that release's file, as written.
    tree = Path(TORCH_TREES or "") / release
    if not TORCH_TREES or not tree.is_dir():
        pytest.skip(f"no unpacked torch {release} (TORCH_OVERLAY_TORCH_TREES)")
    text = (tree / message["file"]).read_text(encoding="utf-8")
    missing = [piece for piece in message["pieces"] if piece not in text]
    assert not missing, f"torch {release} has no {missing} in {message['file']}"
