"""Finding the distinct errors of a traceback or a job log."""

from __future__ import annotations

from torch_overlay.known.logparse import find_errors

PLAIN = """\
Traceback (most recent call last):
  File "/x/train.py", line 3, in <module>
    step()
  File "/x/torch/_functorch/_aot_autograd/runtime_wrappers.py", line 9, in backward
    raise RuntimeError("...")
RuntimeError: Node tangents_1 was invalid, but is output
While executing %x
"""


def test_a_plain_traceback():
    (error,) = find_errors(PLAIN)
    assert error.type == "RuntimeError"
    assert error.message.splitlines() == ["Node tangents_1 was invalid, but is output", "While executing %x"]
    assert any("runtime_wrappers.py" in f for f in error.frames)
    assert error.ranks == []


def test_ansi_colour_and_windows_line_ends():
    coloured = "\x1b[31m" + PLAIN.replace("\n", "\r\n").replace("RuntimeError:", "RuntimeError\x1b[0m:")
    (error,) = find_errors(coloured)
    assert error.type == "RuntimeError" and error.message.startswith("Node tangents_1")


def _ranked(rank: int, text: str) -> list[str]:
    return [f"[rank{rank}]:{' ' if line else ''}{line}" for line in text.splitlines()]


OTHER = """\
Traceback (most recent call last):
  File "/x/train.py", line 3, in <module>
    step()
ValueError: Parameter a.weight is shared with a parameter already managed by another FSDP group
"""


def test_two_ranks_interleaved_failing_differently():
    a, b = _ranked(0, PLAIN), _ranked(1, OTHER)
    lines = [line for pair in zip(a, b) for line in pair] + a[len(b) :]
    errors = find_errors("\n".join(lines))
    assert [(e.type, e.ranks) for e in errors] == [("RuntimeError", ["0"]), ("ValueError", ["1"])]


def test_the_same_error_on_two_ranks_is_one_error():
    text = "\n".join(_ranked(1, PLAIN) + _ranked(0, PLAIN.replace("tangents_1", "tangents_3")))
    (error,) = find_errors(text)
    assert error.ranks == ["0", "1"]


def test_chained_exceptions_keep_every_link():
    text = """\
Traceback (most recent call last):
  File "/x/a.py", line 1, in f
    g()
KeyError: 'step'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/x/b.py", line 2, in h
    f()
RuntimeError: Missing key in checkpoint state_dict: optim.state.0.step
"""
    (error,) = find_errors(text)
    assert error.type == "RuntimeError"
    assert error.chain[0].startswith("KeyError") and len(error.chain) == 2
    assert error.as_error_text().types == ("KeyError", "RuntimeError")


def test_child_failed_error_summary_gives_the_ranks_errors_not_itself():
    text = """\
Traceback (most recent call last):
  File "/usr/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 2)
  traceback : Traceback (most recent call last):
    File "/x/train.py", line 10, in <module>
      model(x)
  torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  traceback : Traceback (most recent call last):
    File "/x/torch/utils/checkpoint.py", line 100, in unpack
      raise CheckpointError(
  torch.utils.checkpoint.CheckpointError: trying to save more tensors during recomputation
============================================================
"""
    errors = find_errors(text)
    assert [(e.type.rsplit(".", 1)[-1], e.ranks) for e in errors] == [
        ("OutOfMemoryError", ["1"]),
        ("CheckpointError", ["0"]),
    ]
    assert any("checkpoint.py" in f for f in errors[1].frames)


def test_cpp_error_records_and_a_pasted_exception_line():
    text = (
        "[rank0]:[E1127 10:00:00.000000 123 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n"
        "E1127 10:00:01.000000 9 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: -6)\n"
    )
    (error,) = find_errors(text)
    assert "Watchdog caught collective operation timeout" in error.message and error.ranks == ["0"]
    (pasted,) = find_errors("AssertionError: FSDP reduce-scatter expects uniform gradient dtype\n")
    assert pasted.type == "AssertionError"


def test_nothing_found_in_a_log_without_errors():
    assert find_errors("step 1 loss 2.3\nstep 2 loss 2.1\n") == []
