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


# How people paste an error (issue reports, forums, chats): each shape gives the error it shows.
def test_markdown_around_the_exception_line():
    for pasted in (
        "It crashed with: `NotImplementedError: Operator aten._is_any_true.default does not have a sharding strategy registered.`",
        "**NotImplementedError: Operator aten._is_any_true.default does not have a sharding strategy registered.**",
        "> NotImplementedError: Operator aten._is_any_true.default does not have a sharding strategy registered.",
        "- `NotImplementedError: Operator aten._is_any_true.default does not have a sharding strategy registered.`",
        "```\nNotImplementedError: Operator aten._is_any_true.default does not have a sharding strategy registered.\n```",
    ):
        (error,) = find_errors(pasted)
        assert error.type == "NotImplementedError", pasted
        assert error.message.startswith("Operator aten._is_any_true.default"), pasted


def test_pytest_failure_prefix_and_doubled_rank_prefixes():
    (error,) = find_errors("E       RuntimeError: boom\nE       second line\n")
    assert (error.type, error.message) == ("RuntimeError", "boom\nsecond line")
    doubled = "\n".join(f"[rank1]:[rank1]: {line}" for line in PLAIN.splitlines())
    (error,) = find_errors(doubled)
    assert error.ranks == ["1"] and any("runtime_wrappers.py" in f for f in error.frames)


def test_frames_without_a_traceback_header_before_or_after_the_message():
    before = """\
```
File "torch/distributed/fsdp/_fully_shard/_fsdp_param.py", line 733,
     in to_accumulated_grad_if_needed
    or self._unsharded_param.grad is None
AttributeError: 'FSDPParam' object has no attribute '_unsharded_param'
```"""
    (error,) = find_errors(before)
    assert error.frames == (
        'File "torch/distributed/fsdp/_fully_shard/_fsdp_param.py", line 733, in to_accumulated_grad_if_needed',
    )
    after = 'TypeError: torch.finfo() requires a floating point input type\n  File "dcp/_consolidate_hf_safetensors.py", line 9, in _parse_input_metadata\n'
    (error,) = find_errors(after)
    assert error.type == "TypeError" and "_parse_input_metadata" in error.frames[0]


def test_exception_classes_not_named_error_and_nccl_lines_without_thread_id():
    (error,) = find_errors("torch._dynamo.exc.FailOnRecompileLimitHit: recompile_limit reached with fullgraph=True\n")
    assert error.type.endswith("FailOnRecompileLimitHit")
    (error,) = find_errors(
        "[rank0]:[E1128 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout\n"
    )
    assert "Watchdog caught" in error.message and error.ranks == ["0"]


def test_warnings_and_prose_are_not_errors():
    assert find_errors("/x/y.py:3: UserWarning: careful with that\nNote: this is fine\n") == []


def test_one_error_on_two_ranks_even_when_one_copy_is_cut_short():
    long = "RuntimeError: Missing key in checkpoint state_dict: optim.state.gate.weight.step.\nmore detail line"
    text = "\n".join(_ranked(0, long) + _ranked(1, long.splitlines()[0]))
    (error,) = find_errors(text)
    assert error.ranks == ["0", "1"]


def test_a_message_without_its_class():
    from torch_overlay.known.logparse import message_only

    error = message_only("the job died with\n```\nNode X was invalid, but is output\n```\n")
    assert error.type == "" and "Node X was invalid" in error.message
    assert error.as_error_text().types == ()


def test_anything_before_the_rank_prefix():
    # A collector's host or IP, a timestamp, srun's task label: the rank prefix after them is read.
    for prefix in ("10.1.2.3: ", "node-17.cluster: ", "2026-01-04 10:00:01,123 ", "0: ", "[2026-01-04T10:00:01Z] "):
        text = "\n".join(prefix + line for line in _ranked(30, PLAIN) + _ranked(2, OTHER))
        errors = find_errors(text)
        assert [(e.type, e.ranks) for e in errors] == [("RuntimeError", ["30"]), ("ValueError", ["2"])], prefix
        assert errors[0].message.splitlines()[0] == "Node tangents_1 was invalid, but is output"


def test_a_message_quoted_as_a_string_or_as_its_repr():
    for line in (
        '"RuntimeError: Node tangents_1 was invalid, but is output"',
        "'RuntimeError: Node tangents_1 was invalid, but is output'.",
        "“RuntimeError: Node tangents_1 was invalid, but is output”",
        "RuntimeError('Node tangents_1 was invalid, but is output')",
        'RuntimeError("Node tangents_1 was invalid, but is output"),',
    ):
        (error,) = find_errors(f"the job fails with\n{line}\n")
        assert (error.type, error.message) == ("RuntimeError", "Node tangents_1 was invalid, but is output"), line
