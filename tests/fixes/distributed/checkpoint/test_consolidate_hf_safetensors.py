# Owner(s): ["oncall: distributed checkpointing"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import importlib.util
import json
import os
import unittest

import torch
import torch.distributed.checkpoint as dist_cp
from torch.distributed.checkpoint._consolidate_hf_safetensors import (
    consolidate_safetensors_files,
)
from torch.distributed.checkpoint._hf_utils import _metadata_fn
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.checkpoint_utils import with_temp_dir

HAS_SAFETENSORS = importlib.util.find_spec("safetensors") is not None


@unittest.skipIf(not HAS_SAFETENSORS, "safetensors not installed")
class TestDcpConsolidateIntTensors(TestCase):
    """Consolidation sizes each tensor by its dtype, integer and bool included."""

    def _state_dict(self) -> dict[str, torch.Tensor]:
        return {
            "weight": torch.arange(12, dtype=torch.float32).view(3, 4),
            "position_ids": torch.arange(6, dtype=torch.int64).view(2, 3) - 3,
            "mask": torch.tensor([[True, False, True], [False, False, True]]),
            "blocks": torch.arange(250, 256, dtype=torch.uint8).view(3, 2),
            "scales": torch.tensor([-128, 0, 127], dtype=torch.int8),
            "counts": torch.tensor([7, -1, 1 << 20], dtype=torch.int32),
        }

    def _check_consolidated(self, output_dir: str, file_name: str) -> None:
        import safetensors.torch

        expected = self._state_dict()
        loaded = safetensors.torch.load_file(os.path.join(output_dir, file_name))
        self.assertEqual(loaded.keys(), expected.keys())
        for fqn, tensor in expected.items():
            self.assertEqual(loaded[fqn].dtype, tensor.dtype, msg=fqn)
            self.assertTrue(torch.equal(loaded[fqn], tensor), msg=fqn)
        with open(os.path.join(output_dir, _metadata_fn)) as f:
            metadata = json.load(f)
        total_size = sum(t.numel() * t.element_size() for t in expected.values())
        self.assertEqual(metadata["metadata"]["total_size"], total_size)

    @with_temp_dir
    def test_consolidate_int_and_bool_tensors(self) -> None:
        sharded_dir = os.path.join(self.temp_dir, "sharded")
        output_dir = os.path.join(self.temp_dir, "consolidated")
        os.makedirs(output_dir)
        dist_cp.save(
            state_dict=self._state_dict(),
            storage_writer=dist_cp.HuggingFaceStorageWriter(path=sharded_dir, save_distributed=True),
        )

        consolidate_safetensors_files(
            sharded_dir,
            output_dir,
            fqn_to_index_mapping=dict.fromkeys(self._state_dict(), 1),
        )

        self._check_consolidated(output_dir, "model-00001-of-00001.safetensors")

    @with_temp_dir
    def test_save_with_consolidation(self) -> None:
        dist_cp.save(
            state_dict=self._state_dict(),
            storage_writer=dist_cp.HuggingFaceStorageWriter(
                path=self.temp_dir, save_distributed=True, enable_consolidation=True
            ),
        )

        self._check_consolidated(self.temp_dir, "model-00001-of-00001.safetensors")


if __name__ == "__main__":
    run_tests()
