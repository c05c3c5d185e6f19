"""``torch-overlay explain``: a log in, per error the known bug and what it means for a torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torch_overlay.cli.main import main
from torch_overlay.known.catalogue import load_catalogue
from torch_overlay.known.subsystems import pointed_at
from torch_overlay.known.verdicts import explain_log

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"

SPLIT_SLICE = """\
Traceback (most recent call last):
  File "/work/moe.py", line 40, in <module>
    compiled(x, counts)
  File "/site/torch/_inductor/graph.py", line 1200, in run_node
    assert new_unbacked_defs >= renamed_unbacked_bindings
torch._inductor.exc.InductorError: AssertionError: failed OrderedSet([]) >= OrderedSet([u4]) (inductor >= fx)
fx node is: %split_with_sizes
"""
OOM = """\
Traceback (most recent call last):
  File "/work/train.py", line 12, in <module>
    loss.backward()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.32 GiB of which 1.20 GiB is free.
"""
SHAPE = """\
Traceback (most recent call last):
  File "/work/model.py", line 7, in forward
    return self.proj(x)
RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x16 and 32x8)
"""
NCCL_TIMEOUT = (
    "[rank1]:[E1127 10:00:00.000000 123 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
    "ran for 600012 milliseconds before timing out.\n"
)


def _ranked(rank: int, text: str) -> str:
    return "".join(f"[rank{rank}]: {line}\n" for line in text.splitlines())


@pytest.fixture
def log(tmp_path):
    def write(text: str, name: str = "job.log") -> str:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return str(path)

    return write


def _explain(capsys, *args: str) -> tuple[int, dict]:
    rc = main(["explain", "--json", *args])
    return rc, json.loads(capsys.readouterr().out)


def test_a_fixed_bug_for_releases_before_during_and_after(capsys, log):
    path = log(SPLIT_SLICE)
    rc, out = _explain(capsys, path, "--torch", "2.11.0")
    assert rc == 0
    (error,) = out["errors"]
    (match,) = error["matches"]
    assert match["id"] == "inductor-unbacked-split-slice" and match["verdict"] == "fixed-by-overlay"
    assert "also fixed upstream in torch 2.13.0" in match["advice"]
    assert match["broken_on"] == "2.11, 2.12 (fixed upstream in 2.13.0)"
    assert match["links"] == ["https://github.com/pytorch/torchtitan/issues/2776"]
    _, out = _explain(capsys, path, "--torch", "2.14.1")
    assert out["errors"][0]["matches"][0]["verdict"] == "fixed-upstream"


def test_unrelated_errors_are_not_known_bugs(capsys, log):
    for text in (OOM, SHAPE, NCCL_TIMEOUT):
        rc, out = _explain(capsys, log(text), "--torch", "2.13.0")
        assert rc == 1, text
        (error,) = out["errors"]
        assert error["known"] is False and error["matches"] == []


def test_two_ranks_failing_differently_name_both(capsys, log):
    a, b = _ranked(0, SPLIT_SLICE).splitlines(), _ranked(1, SHAPE).splitlines()
    interleaved = "\n".join(x for pair in zip(a, b) for x in pair) + "\n" + "\n".join(a[len(b) :])
    rc, out = _explain(capsys, log("\x1b[1m" + interleaved + "\x1b[0m\n"), "--torch", "2.12.1")
    assert rc == 1  # one of them is not a known bug
    assert [(e["ranks"], e["known"]) for e in out["errors"]] == [(["0"], True), (["1"], False)]


def test_looked_at_report_gives_its_workaround(capsys, log):
    text = (
        'Traceback (most recent call last):\n  File "/x/t.py", line 1, in <module>\n    loss.backward()\n'
        "torch.utils.checkpoint.CheckpointError: torch.utils.checkpoint: trying to save more tensors during "
        "recomputation than during the original forward pass.\n"
    )
    rc, out = _explain(capsys, log(text), "--torch", "2.15.0")
    assert rc == 0
    (match,) = out["errors"][0]["matches"]
    assert match["kind"] == "looked-at" and match["verdict"] == "known-not-fixed"
    assert "_set_lru_cache(False)" in match["advice"]


def test_disabled_fix_on_the_installed_torch_says_so():
    catalogue = load_catalogue(PATCHES)
    (ex,) = explain_log(
        SPLIT_SLICE,
        catalogue,
        "2.12.1",
        installed=True,
        env={"TORCH_OVERLAY_DISABLE": "x,inductor-unbacked-split-slice"},
    )
    assert ex.matches[0].verdict == "fix-not-active"
    assert "TORCH_OVERLAY_DISABLE names it" in ex.matches[0].advice
    (ex,) = explain_log(SPLIT_SLICE, catalogue, "2.12.1", installed=True, env={"TORCH_OVERLAY": "0"})
    assert "TORCH_OVERLAY=0 turns the overlay off" in ex.matches[0].advice
    warned = (
        "UserWarning: torch_overlay: patch inductor-unbacked-split-slice failed: torch._inductor.lowering was "
        "imported before torch_overlay; import torch_overlay first or use the launcher; torch is left unpatched\n"
    )
    (ex,) = explain_log(warned + SPLIT_SLICE, catalogue, "2.12.1")
    assert ex.matches[0].verdict == "fix-not-active" and "imported before torch_overlay" in ex.matches[0].advice


def test_exit_status_and_text_output(capsys, log, tmp_path):
    assert main(["explain", log(SPLIT_SLICE), "--torch", "2.11.0"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("error 1 of 1: torch._inductor.exc.InductorError: AssertionError: failed OrderedSet")
    assert "known bug: inductor-unbacked-split-slice (fix; torchtitan#2776)" in text
    assert main(["explain", log("all good\n")]) == 1
    assert "no error found" in capsys.readouterr().out
    assert main(["explain", str(tmp_path / "missing.log")]) == 2
    binary = tmp_path / "core"
    binary.write_bytes(b"\x7fELF\0\0\0")
    assert main(["explain", str(binary)]) == 2


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_is_refused_at_once_as_a_file_and_as_standard_input(device):
    # /dev/zero once ran out of memory (exit 1, a traceback) and /dev/urandom never ended.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "torch_overlay", "explain", "--torch", "2.13.0"]
    proc = subprocess.run([*command, device], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and f"cannot read {device}: not a regular file" in proc.stderr, proc.stderr
    with open(device, "rb") as stdin:
        proc = subprocess.run(command, stdin=stdin, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and "cannot read standard input: binary data" in proc.stderr, proc.stderr


def test_a_pipe_is_read_and_a_log_too_large_or_not_text_is_refused(capsys, tmp_path, monkeypatch):
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(SPLIT_SLICE, encoding="utf-8"))
    writer.start()
    assert main(["explain", str(fifo), "--torch", "2.11.0"]) == 0
    writer.join()
    capsys.readouterr()
    assert main(["explain", str(tmp_path)]) == 2
    assert "not a regular file" in capsys.readouterr().err
    latin = tmp_path / "latin.log"
    latin.write_bytes(SPLIT_SLICE.replace("moe", "mo\xe9").encode("latin-1"))
    assert main(["explain", str(latin), "--torch", "2.11.0"]) == 0  # a stray byte is not binary
    noise = tmp_path / "noise.log"
    noise.write_bytes(bytes(range(128, 256)) * 64)
    assert main(["explain", str(noise)]) == 2
    monkeypatch.setattr("torch_overlay.cli.explain._MAX_BYTES", 70000)
    big = tmp_path / "big.log"
    big.write_text(SPLIT_SLICE * 300, encoding="utf-8")
    assert main(["explain", str(big)]) == 2
    assert "larger than" in capsys.readouterr().err


def test_standard_input_without_importing_torch_and_fast():
    code = (
        "import sys, time\n"
        "from torch_overlay.cli.main import main\n"
        "start = time.process_time()\n"
        "rc = main(['explain', '--torch', '2.11.0'])\n"
        "print('torch imported:', 'torch' in sys.modules, 'cpu:', time.process_time() - start, file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], input=SPLIT_SLICE, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    assert "inductor-unbacked-split-slice" in proc.stdout
    assert "torch imported: False" in proc.stderr
    cpu = float(proc.stderr.rsplit("cpu:", 1)[1])
    assert cpu < 0.5, f"explain took {cpu:.2f} s of CPU (whole process {wall:.2f} s wall)"


def test_possibly_when_the_paste_lacks_the_frame_a_signature_asks_for(capsys, log):
    # 0023's signature asks for the frame `to_accumulated_grad_if_needed`: a message quoted alone
    # is possibly that bug, with a traceback it is known; the exit status is 0 for both.
    message = "AttributeError: 'FSDPParam' object has no attribute '_unsharded_param'\n"
    rc, out = _explain(capsys, log(message), "--torch", "2.13.0")
    assert rc == 0
    assert [(m["id"], m["confidence"]) for m in out["errors"][0]["matches"]] == [
        ("fsdp-accumulated-grad-unused-unit", "possibly")
    ]
    framed = (
        'Traceback (most recent call last):\n  File "/s/torch/distributed/fsdp/_fully_shard/_fsdp_param.py", line 7, in to_accumulated_grad_if_needed\n    x\n'
        + message
    )
    rc, out = _explain(capsys, log(framed), "--torch", "2.13.0")
    assert [(m["id"], m["confidence"]) for m in out["errors"][0]["matches"]] == [
        ("fsdp-accumulated-grad-unused-unit", "known")
    ]
    assert main(["explain", log(message), "--torch", "2.13.0"]) == 0
    assert "possibly a known bug: fsdp-accumulated-grad-unused-unit" in capsys.readouterr().out


def test_the_overlays_own_line_in_the_log_gives_its_remedy(capsys, log):
    hint = (
        "torch_overlay: this error is a known torch bug (torchtitan#2776) that inductor-unbacked-split-slice fixes, "
        "but that fix is disabled in this process: TORCH_OVERLAY=0. Unset TORCH_OVERLAY=0 to apply it.\n"
    )
    rc, out = _explain(capsys, log(SPLIT_SLICE + hint), "--torch", "2.11.0")
    (match,) = out["errors"][0]["matches"]
    assert match["verdict"] == "fix-not-active"
    assert "Unset TORCH_OVERLAY=0 to apply it" in match["advice"]


def test_the_torch_version_is_said_once_and_checked(capsys, log):
    assert main(["explain", log(SPLIT_SLICE), "--torch", "2.11.0"]) == 0
    text = capsys.readouterr().out
    assert text.count("2.11.0") == 1, text
    assert main(["explain", log(SPLIT_SLICE), "--torch", "banana"]) == 2
    assert "not a torch version" in capsys.readouterr().err
    rc, out = _explain(capsys, log(SPLIT_SLICE), "--torch", "9.9")
    (match,) = out["errors"][0]["matches"]
    assert (
        match["verdict"] in ("fixed-upstream", "no-fix-for-this-torch")
        and "applies on torch 9.9" not in match["advice"]
    )


def test_a_closed_pipe_ends_quietly(log):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    big = SPLIT_SLICE * 1 + "".join(f"RuntimeError: other error number {n} with a long text\n\n" for n in range(3000))
    cmd = f"{sys.executable} -m torch_overlay explain --torch 2.11.0 {log(big)} | head -1"
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env)
    assert proc.stdout.startswith("error 1 of")
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr


def test_a_guess_only_where_the_text_points_at_the_part_of_torch_with_the_bug():
    # "division by zero" is inductor-cpp-unbacked-parallel-depth's only with its frame; quoted alone,
    # a guess only where the text speaks of compile (plain Python code prints it too).
    catalogue = load_catalogue(PATCHES)

    def named(text: str) -> list[tuple[str, str]]:
        return [(m.bug.id, m.confidence) for ex in explain_log(text, catalogue, "2.13.0", env={}) for m in ex.matches]

    assert named("ZeroDivisionError: division by zero\n") == []
    guess = "torch.compile of the model fails:\nZeroDivisionError: division by zero\n"
    assert named(guess) == [("inductor-cpp-unbacked-parallel-depth", "possibly")]

    # An SDPA op without a sharding strategy is a context-parallel bug only where the text speaks of
    # CP: tensor parallelism with another attention backend prints the same message.
    sdpa = (
        "NotImplementedError: Operator aten._scaled_dot_product_flash_attention.default "
        "does not have a sharding strategy registered.\n"
    )
    assert named(f"a tensor-parallel attention test fails:\n{sdpa}") == []
    assert named(f"the step inside context_parallel() fails:\n{sdpa}") == [
        ("context-parallel-exit-on-exception", "possibly")
    ]


def test_a_bug_is_in_the_parts_its_title_names_not_in_where_it_was_met():
    # clip_grad_norm_ over DTensor and plain gradients is a DTensor bug; FSDP2 (its symptom's example,
    # its test's folder) is one way to meet it, which a paste of the message need not name.
    catalogue = load_catalogue(PATCHES)
    bugs = {b.id: b for b in catalogue.bugs}
    assert bugs["clip-grad-norm-mixed-meshes"].parts == {"dtensor"}
    assert "fsdp" in bugs["fsdp-accumulated-grad-dtype"].parts
    untitled = [b for b in catalogue.bugs if b.kind == "fix" and not pointed_at(b.title)]
    assert untitled and all(b.parts == pointed_at(b.patch.main.fields.get("Symptom", "")) for b in untitled)

    def named(text: str) -> list[tuple[str, str]]:
        return [(m.bug.id, m.confidence) for ex in explain_log(text, catalogue, "2.13.0", env={}) for m in ex.matches]

    # The message quoted without frames, with a foreach op both run or without an op: a guess at
    # each, FSDP named or not; with an op only one of them runs (the norm), a guess at that one.
    both = [("clip-grad-norm-mixed-meshes", "possibly"), ("optimizer-foreach-mixed-dtensor", "possibly")]
    quoted = "clip_grad_norm_ fails: `RuntimeError: aten._foreach_mul_.Scalar: got mixed torch.Tensor and DTensor`\n"
    assert sorted(named(quoted)) == both
    norm = quoted.replace("_foreach_mul_", "_foreach_norm")
    assert sorted(named(norm)) == [("clip-grad-norm-mixed-meshes", "possibly")]
    assert sorted(named("RuntimeError: got mixed torch.Tensor and DTensor during gradient clipping\n")) == both


# functorch prints "Cannot access storage of TensorWrapper" for any transformed code that reads a
# tensor's storage; it is fsdp-jvp's only where FSDP2's frames show, a guess only where the text
# speaks of FSDP.
JACREV_STORAGE = """\
Traceback (most recent call last):
  File "/work/jac.py", line 9, in <module>
    jacrev(func)(a)
  File "/venv/lib/python3.11/site-packages/torch/_functorch/eager_transforms.py", line 601, in wrapper_fn
    vjp_out = _vjp_with_argnums(func, *args, argnums=argnums, has_aux=has_aux)
  File "/work/jac.py", line 5, in func
    b.untyped_storage()
NotImplementedError: Cannot access storage of TensorWrapper
"""
FSDP_JVP_STORAGE = """\
Traceback (most recent call last):
  File "/work/train.py", line 30, in <module>
    out, tangent = torch.func.jvp(model, (x,), (t,))
  File "/venv/lib/python3.11/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_param.py", line 930, in alloc_storage
    if (storage := tensor.untyped_storage()).size() != size:
NotImplementedError: Cannot access storage of TensorWrapper
"""


def test_tensor_wrapper_storage_is_fsdp_jvp_only_with_fsdp():
    catalogue = load_catalogue(PATCHES)

    def named(text: str) -> list[tuple[str, str]]:
        return [(m.bug.id, m.confidence) for ex in explain_log(text, catalogue, "2.13.0", env={}) for m in ex.matches]

    assert named(JACREV_STORAGE) == []
    assert named("NotImplementedError: Cannot access storage of TensorWrapper\n") == []
    assert named(FSDP_JVP_STORAGE) == [("fsdp-jvp", "known")]
    assert named(
        "torch.func.jvp through my fully_shard model:\nNotImplementedError: Cannot access storage of TensorWrapper\n"
    ) == [("fsdp-jvp", "possibly")]


# DTensor's C++ dispatch fast path words the mixed-tensor error without the colon its Python path
# puts after the op (2.13.0, transformers' own TP with clip_grad_norm_, tests/recipes/).
MIXED_FROM_CPP = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/work/train.py", line 25, in main
[rank0]:     norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
[rank0]:   File "/venv/lib/python3.11/site-packages/torch/nn/utils/clip_grad.py", line 95, in _get_total_norm
[rank0]:     norms.extend(torch._foreach_norm(device_tensors, norm_type))
[rank0]: RuntimeError: aten._foreach_norm.Scalar got mixed torch.Tensor and DTensor, need to convert all \
torch.Tensor to DTensor before calling distributed operators!
"""


def test_the_mixed_tensor_error_of_the_cpp_path_is_known():
    (ex,) = explain_log(MIXED_FROM_CPP, load_catalogue(PATCHES), "2.13.0")
    assert [(m.bug.id, m.confidence) for m in ex.matches] == [("clip-grad-norm-mixed-meshes", "known")]


def test_explain_answers_in_a_python_without_torch(tmp_path):
    # A laptop without torch: `import torch_overlay` has nothing to patch, and explain still answers.
    path = tmp_path / "job.log"
    path.write_text(MIXED_FROM_CPP, encoding="utf-8")
    no_torch = (
        "import runpy, sys; sys.modules['torch'] = None; "
        f"sys.argv = ['torch_overlay', 'explain', {str(path)!r}]; runpy.run_module('torch_overlay', run_name='__main__')"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", no_torch], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "known bug: clip-grad-norm-mixed-meshes" in proc.stdout and "no torch is" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
