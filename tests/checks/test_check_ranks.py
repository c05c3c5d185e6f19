# Owner(s): ["oncall: distributed"]
"""check_ranks: ranks running a different torch or different overlay fixes are named."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed.tensor import distribute_tensor, Replicate
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)

import torch_overlay
from torch_overlay.checks.ranks import check_ranks
from torch_overlay.checks.replicas import check_replicas


REPO = Path(__file__).resolve().parents[2]
# Its target is torch.distributed.tensor, imported by every rank below: decided
# (applied, or upstream from torch 2.14) wherever it is not disabled.
PATCH_ID = "dtensor-new-factory-shard-partial"


class CheckRanksTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 4

    @with_comms
    def test_agree(self) -> None:
        with CommDebugMode() as comm_mode:
            report = check_ranks()
        self.assertTrue(report.ok, str(report))
        self.assertEqual([e.rank for e in report.entries], [0, 1, 2, 3])
        self.assertEqual(report.entries[0].patches.keys(), {r.id for r in torch_overlay.status()})
        # Ranks that agree cost one all-gather of a hash.
        self.assertEqual((report.num_collectives, comm_mode.get_total_counts()), (1, 1))
        self.assertIn(f"ranks agree (4 ranks, {len(torch_overlay.status())} patches)", str(report))

    @with_comms
    def test_state_differs_on_one_rank(self) -> None:
        rows = torch_overlay.status()
        if self.rank == 2:
            rows = [r.replace(state="disabled") if r.id == PATCH_ID else r for r in rows]
        with mock.patch.object(torch_overlay, "status", return_value=rows):
            report = check_ranks()
        self.assertFalse(report.ok)
        self.assertEqual(report.differing_ranks, (2,))
        (diff,) = report.differences
        self.assertEqual((diff.kind, diff.patch_id, diff.found), ("state", PATCH_ID, "disabled"))
        self.assertEqual(report.reference_rank, 0)
        self.assertIn(f"rank 2: patch {PATCH_ID} state disabled", str(report))

    @with_comms
    def test_check_replicas_includes_ranks(self) -> None:
        mesh = self.build_device_mesh()
        module = torch.nn.Linear(4, 4)
        module.weight = torch.nn.Parameter(distribute_tensor(module.weight.detach(), mesh, [Replicate()]))
        version = "0.0.0" if self.rank == 3 else torch.__version__
        with mock.patch.object(torch, "__version__", version):
            report = check_replicas(module)
        self.assertEqual(report.mismatches, ())
        self.assertFalse(report.ok)
        self.assertEqual(report.ranks.differing_ranks, (3,))
        self.assertEqual(report.ranks.differences[0].kind, "version")
        self.assertIn("rank 3: torch 0.0.0", str(report))


# Each rank in its own interpreter, so that TORCH_OVERLAY_DISABLE is read at
# import as in a real job whose nodes are configured differently.
WORKER = """
import json, sys
import torch_overlay
import torch
import torch.distributed as dist
import torch.distributed.tensor  # decides the DTensor patches
from torch_overlay.checks.replicas import check_replicas

rank, world_size, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
report = torch_overlay.check_ranks()
replicas = check_replicas(torch.nn.Linear(2, 2))
dist.destroy_process_group()
print(json.dumps({
    "ok": report.ok,
    "differing_ranks": report.differing_ranks,
    "differences": [[d.rank, d.kind, d.patch_id, d.expected, d.found] for d in report.differences],
    "replicas_ok": replicas.ok,
    "text": str(report),
}))
"""


class CheckRanksEnvironmentTest(TestCase):
    def test_without_process_group(self) -> None:
        self.assertFalse(dist.is_initialized())
        report = check_ranks()
        self.assertTrue(report.ok)
        self.assertEqual((len(report.entries), report.num_collectives), (1, 0))

    def _run(self, world_size: int, env_of_rank: dict[int, dict[str, str]]) -> list[dict]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")}
        base["PYTHONPATH"] = os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")])
        with tempfile.TemporaryDirectory() as tmp:
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", WORKER, str(rank), str(world_size), f"{tmp}/store"],
                    env={**base, **env_of_rank.get(rank, {})},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for rank in range(world_size)
            ]
            outs = [p.communicate(timeout=300) for p in procs]
        for p, (_, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err[-3000:])
        return [json.loads(out.splitlines()[-1]) for out, _ in outs]

    def _check_one_rank_disabled(self, world_size: int, rank: int) -> None:
        results = self._run(world_size, {rank: {"TORCH_OVERLAY_DISABLE": PATCH_ID}})
        state = next(r.state for r in torch_overlay.status() if r.id == PATCH_ID)
        for result in results:  # the same report on every rank
            self.assertFalse(result["ok"])
            self.assertFalse(result["replicas_ok"])
            self.assertEqual(result["differing_ranks"], [rank])
            self.assertEqual(result["differences"], [[rank, "state", PATCH_ID, state, "disabled"]])
        self.assertIn(f"rank {rank}: patch {PATCH_ID} state disabled", results[0]["text"])

    def test_agree_world_size_2(self) -> None:
        for result in self._run(2, {}):
            self.assertTrue(result["ok"], result["text"])
            self.assertTrue(result["replicas_ok"])

    def test_one_rank_disables_a_patch_world_size_2(self) -> None:
        self._check_one_rank_disabled(2, 1)

    def test_one_rank_disables_a_patch_world_size_4(self) -> None:
        self._check_one_rank_disabled(4, 2)

    def test_series_differs_world_size_4(self) -> None:
        # Rank 3 runs a series without the last patch, rank 1 one whose first patch
        # text was edited: both are named, the others agree.
        patches = REPO / "patches"
        with tempfile.TemporaryDirectory() as tmp:
            short, edited = Path(tmp, "short"), Path(tmp, "edited")
            for folder in (short, edited):
                folder.mkdir()
                for f in patches.iterdir():
                    if f.is_file():  # the series' files, not patches/captured/
                        (folder / f.name).write_text(f.read_text())
            series = (patches / "series").read_text().split()
            # Drop the last patch with its variants (files of one patch share the number).
            number = series[-1].split("-", 1)[0]
            (short / "series").write_text("\n".join(n for n in series if not n.startswith(f"{number}-")) + "\n")
            first = edited / series[0]
            first.write_text(first.read_text().replace("\n---\n", "\nAn edit.\n---\n", 1))
            results = self._run(
                4,
                {3: {"TORCH_OVERLAY_PATCHES": str(short)}, 1: {"TORCH_OVERLAY_PATCHES": str(edited)}},
            )
        last_id = torch_overlay.status()[-1].id
        first_id = torch_overlay.status()[0].id
        kinds = {(d[0], d[1], d[2]) for d in results[0]["differences"]}
        self.assertEqual(kinds, {(3, "missing", last_id), (1, "variant", first_id)})
        self.assertEqual(results[0]["differing_ranks"], [1, 3])


if __name__ == "__main__":
    run_tests()
