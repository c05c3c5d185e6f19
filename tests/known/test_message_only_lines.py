"""Which ``Error:`` lines make ``explain`` sure of a bug on the message alone, and why.

A line with no ``frame=``, ``type=`` or ``possibly`` answers *known* for any text holding its
message. That is right only where nothing but the bug prints the message: the code the fix changes
raises it, or only the bug's path can reach the raise. A message that a generic site downstream of
the bug raises for other callers too (DTensor's handler for any ``as_strided``, DCP's load planner
for any missing key) needs the frame of the bug's own path, or ``| possibly`` where no traceback
shows one (docs/reference/patch-format.md, "Error signatures"). Each message-only line is listed
here with the reason it is sure; a new one fails until it is given one, so that a guess does not
become a sure answer unnoticed.
"""

from __future__ import annotations

from pathlib import Path

from torch_overlay.known.catalogue import load_catalogue

REPO = Path(__file__).resolve().parents[2]

# (bug id, Error: line) -> why the message alone names the bug.
WHY_SURE = {
    ("aot-subclass-outputs-symint-slots", "could not match output layout with optional SymInt outputs"): (
        "raised by the subclass output-layout code that the fix changes"
    ),
    (
        "aot-subclass-outputs-symint-slots",
        r"re:_dtensor__new__\(\): argument 'local_tensor' \(position 2\) must be Tensor, not int",
    ): "an int in DTensor's local-tensor slot: AOTAutograd's subclass rewrapping with the slots shifted, no other caller passes it",
    (
        "inductor-unbacked-split-slice",
        r"re:failed OrderedSet\(\[.*\]\) >= OrderedSet\(\[.*\]\) \(inductor >= fx\)",
    ): "inductor's unbacked-symbol check after a lowering; no other cause seen in the corpus",
    ("inductor-unbacked-split-rebind", r"re:should have been constant, but got .*u\d+"): (
        "raised by symbolic_shapes' rebinding of unbacked symbols, which the fix changes"
    ),
    (
        "inductor-unbacked-split-scatter",
        r"re:shape error in scatter op, can not broadcast torch\.Size\(\[[^\]]*u\d+",
    ): "an unbacked size in inductor's scatter reinplacing: only the split lowering's unbacked sizes seen there",
    ("dtensor-strided-shard-view-compile", r"re:Pending unbacked symbols \{u\d+(, u\d+){7,}"): (
        "eight or more pending unbacked symbols: the _StridedShard view's local sizes; other pending-symbol "
        "errors in the corpus have one to four"
    ),
    ("fsdp-unused-params-backward-order", r"re:object has no attribute 'set_reduce_scatter_unused_params'"): (
        "the method the fix adds, called by trainers written for it"
    ),
    (
        "aot-subclass-outputs-alias-intermediate",
        "ANY output aliasing (even for regular tensors) is currently unsupported if there are any subclass outputs",
    ): "raised by aot_autograd.py's check that the fix changes",
    (
        "aot-subclass-outputs-alias-intermediate",
        r"re:graph with two graph outputs\s+that alias one another, which is currently unsupported in the subclass use case",
    ): "the same check's wording before 2.11 (2.4 to 2.8)",
    (
        "aot-unused-subclass-output-zero-tangent",
        r"re:guessed its metadata incorrectly\. Expected metadata: .* expected type: "
        r"<class 'torch\.distributed\.tensor\.(_api\.)?DTensor'> Runtime metadata: None, runtime type: <class 'torch\.Tensor'>",
    ): (
        "AOTAutograd's tangent check (runtime_wrappers) given a plain tensor where the graph returned a DTensor, "
        "with no runtime metadata: the zero gradient autograd makes for an output the loss does not use, the cause "
        "torch's own message gives (2.12+: 'backward() is only called on some of them'), which the fix replaces "
        "before the check"
    ),
    ("aot-unused-subclass-output-zero-tangent", r"re:Expected a DTensor tangent but got a plain Tensor"): (
        "the same check, newer wording"
    ),
    (
        "dtensor-foreach-norm-dtype",
        r"re:'>=' not supported between instances of 'torch\.dtype' and 'int'\s+Sharding propagation failed "
        r"for aten\._foreach_norm\.Scalar",
    ): "raised in the _foreach_norm strategy that the fix changes",
    (
        "fsdp-accumulated-grad-dtype",
        r"re:FSDP reduce-scatter expects uniform gradient dtype but got \{(torch\.b?float16, torch\.float32|"
        r"torch\.float32, torch\.b?float16)\}",
    ): "a low-precision and an fp32 gradient in one reduce-scatter: the accumulated gradient the fix casts",
    (
        "sac-ignore-runtime-ops",
        r"re:profiler\._record_function_(enter|enter_new|exit)\.\w+ (invocation index \d+ )?encountered during "
        r"backward,? but not found in storage | unless=aten\.\w+\.\w+ (invocation index \d+ )?encountered during backward",
    ): "raised by SAC for the runtime op that the fix makes it ignore (unless= takes out SAC rejecting a compute op)",
    (
        "sac-ignore-runtime-ops",
        r"re:fsdp\.\w+\.default (invocation index \d+ )?encountered during backward,? but not found in storage"
        r" | unless=aten\.\w+\.\w+ (invocation index \d+ )?encountered during backward",
    ): "the same, for FSDP's ops",
    (
        "sac-ignore-runtime-ops",
        r"re:_?c10d(_functional)?\.\w+\.default (invocation index \d+ )?encountered during backward,? but not "
        r"found in storage | unless=aten\.\w+\.\w+ (invocation index \d+ )?encountered during backward",
    ): "the same, for c10d's ops",
    ("fsdp-shared-param-grouping-message", "is shared with a parameter already managed by another FSDP group"): (
        "raised by the check that the fix changes"
    ),
    (
        "dtensor-is-any-true-strategy",
        "Operator aten._is_any_true.default does not have a sharding strategy registered",
    ): ("the missing strategy is the bug"),
    ("fsdp-gloo-gradient-divide-factor", "Cannot use ReduceOp.PREMUL_SUM with Gloo"): (
        "FSDP2's gradient divide factor is what asks gloo for PREMUL_SUM"
    ),
    (
        "dtensor-norm-partial-backward",
        r"re:aten\.masked_fill_\.Scalar: in-place operations that require placement changes are not supported",
    ): "the op of the norm's backward that the fix gives a strategy for (other ops' in-place errors do not match)",
    (
        "dtensor-rms-norm-sharded-dim",
        r"re:aten\.add_\.Scalar: in-place operations that require placement changes are not supported",
    ): "the op of the RMS norm's backward that the fix gives a strategy for (other ops' in-place errors do not match)",
    ("dtensor-view-flatten-shard1", r"re:Attempted to flatten multiple dimensions, with dimension \d+ being sharded"): (
        "a looked-at report of the message itself"
    ),
    ("dtensor-view-flatten-shard1", r"re:Attempted to flatten sharded dimension \d+\b"): "the same, older wording",
    ("meta-histc-int64", '"histogram_cpu" not implemented for'): "a looked-at report of the message itself",
    ("dynamo-fake-tensor-mode-init-skip", r"re:function `?FakeTensorMode\.__init__`? should not be traced"): (
        "a looked-at report of the message itself"
    ),
    ("dynamo-fake-tensor-mode-init-skip", r"re:Skip inlining function <function FakeTensorMode\.__init__ at"): (
        "the same, another wording"
    ),
    (
        "dynamo-autograd-function-captured-alias",
        r"re:An intermediate tensor '.*' created inside a higher-order op subgraph aliases an input or output",
    ): "a looked-at report of the message itself",
}


def test_every_message_only_line_says_why_the_message_is_enough():
    catalogue = load_catalogue(REPO / "patches")
    message_only = {
        (bug.id, sig.source)
        for bug in catalogue.bugs
        for sig in bug.signatures
        if sig.frame is None and sig.type is None and not sig.generic
    }
    unexplained = sorted(message_only - WHY_SURE.keys())
    assert not unexplained, (
        "Error: lines that name a bug as known on the message alone, with no reason here why nothing else "
        "prints it (add a frame= of the bug's path, `| possibly`, or a reason):\n"
        + "\n".join(f"{pid}: {line}" for pid, line in unexplained)
    )
    assert not WHY_SURE.keys() - message_only, f"stale entries: {sorted(WHY_SURE.keys() - message_only)}"
