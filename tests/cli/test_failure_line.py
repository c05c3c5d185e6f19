"""The line ``verify`` and the demo show for a failed reproducer: what went wrong, never a wrapper."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from torch_overlay.cli.failure_line import failure_line
from torch_overlay.cli.pytest_runner import read_junit
from torch_overlay.cli.verify import RunOutcome, _case_outcome

# pytest's JUnit report of a MultiProcessTestCase failure (torch 2.13, dist-nn-broadcast-subgroup-grad):
# the message attribute is cut after a few lines, the element text has the whole report.
CHILD_MESSAGE = (
    "RuntimeError: Process 1 exited with error code 10 and exception:\n"
    "Traceback (most recent call last):\n"
    '  File "/x/common_distributed.py", line 1058, in run_test\n'
    "    getattr(self, test_name)()\n"
    "[+16 more lines; full report in element text]"
)
CHILD_TEXT = """\
        if errored_processes:
            error = ""
>           raise RuntimeError(error)
E           RuntimeError: Process 1 exited with error code 10 and exception:
E           Traceback (most recent call last):
E             File "/x/common_distributed.py", line 1058, in run_test
E               getattr(self, test_name)()
E             File "/work/main/tests/fixes/distributed/test_c10d_spawn_gloo.py", line 40, in test_grad
E               self.assertEqual(x.grad, torch.full_like(x, 3.0))
E           AssertionError: Tensor-likes are not close!
E
E           Mismatched elements: 6 / 6 (100.0%)

/x/common_distributed.py:1213: RuntimeError
"""


def _outcome(tmp_path: Path, tag: str, message: str, text: str) -> RunOutcome:
    """verify's outcome for a test whose JUnit report has ``<tag message=...>text</tag>``."""
    case = ET.Element("testcase", classname="t.C", name="test_x", time="1.5")
    child = ET.SubElement(case, tag, message=message)
    child.text = text
    report = tmp_path / "junit.xml"
    ET.ElementTree(case).write(report, encoding="utf-8")
    return _case_outcome(read_junit(report)["t.C::test_x"])


def test_a_child_process_failure_gives_the_childs_error_from_the_full_report(tmp_path):
    outcome = _outcome(tmp_path, "failure", CHILD_MESSAGE, CHILD_TEXT)
    assert outcome.state == "fail"
    assert outcome.detail == "AssertionError: Tensor-likes are not close!"


def test_an_error_whose_message_starts_on_the_next_line_gets_that_line():
    text = "E       RuntimeError: \nE         Failed running call_function aten.mm: shapes cannot be multiplied\n"
    expected = "RuntimeError: Failed running call_function aten.mm: shapes cannot be multiplied"
    assert failure_line("RuntimeError: ", text) == expected


def test_a_checkpoint_exception_gives_the_ranks_error():
    text = (
        "E   torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([0])\n"
        "E   Traceback (most recent call last): (RANK 0)\n"
        'E     File "/x/state_dict.py", line 9, in _init_optim_state\n'
        "E   RuntimeError: attempting to assign a gradient with dtype 'float' to a tensor with grad_dtype 'bf16'\n"
    )
    assert failure_line("", text).startswith("RuntimeError: attempting to assign a gradient")


def test_not_raised_says_which_check_expected_it():
    text = (
        '>       with self.assertRaisesRegex(AssertionError, "was invalid, but is output"):\n'
        "E       AssertionError: AssertionError not raised\n"
    )
    line = failure_line("AssertionError: AssertionError not raised", text)
    assert line == (
        "AssertionError: AssertionError not raised "
        '(with self.assertRaisesRegex(AssertionError, "was invalid, but is output"))'
    )


def test_a_chained_error_gives_its_cause_and_plain_messages_still_read():
    text = (
        "E   AssertionError: Node tangents_1 was invalid, but is output\n"
        "E   The above exception was the direct cause of the following exception:\n"
        "E   torch._dynamo.exc.BackendCompilerFailed: backend='aot_eager' raised:\n"
    )
    assert failure_line("", text) == "AssertionError: Node tangents_1 was invalid, but is output"
    assert failure_line("wrapper raised:\nthe reason", "") == "the reason"
    assert failure_line("assert 1 == 2\n +  where 1 = f()", "E   assert 1 == 2") == "assert 1 == 2"
    assert failure_line("", "") == ""


def test_skip_reasons_come_from_the_message(tmp_path):
    outcome = _outcome(tmp_path, "skipped", "needs a GPU", "/x/test.py:3: needs a GPU")
    assert (outcome.state, outcome.detail) == ("skipped", "needs a GPU")
