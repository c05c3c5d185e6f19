"""A user's training loop over transformers' own tensor parallelism: a tiny random Llama made from a
config (no download), loaded with ``DistributedConfig(tp_size=WORLD_SIZE)``, trained a few steps with
``torch.nn.utils.clip_grad_norm_`` and AdamW on gloo. Rank 0 prints one JSON line per step, and the
loss and gradient norm of the same first step on the unsharded model, for comparison.

Run: ``torchrun --nproc_per_node 2 transformers_tp_train.py MODEL_DIR`` (under ``torch-overlay-run``
for the fixes).
"""

import json
import sys

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.distributed.configuration_utils import DistributedConfig

STEPS = 3


def _batch() -> torch.Tensor:
    return torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))


def _unsharded_first_step(folder: str) -> tuple[float, float]:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = _batch()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()


def main(folder: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        config = LlamaConfig(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    dist.barrier()
    tp = DistributedConfig(tp_size=dist.get_world_size())
    model = AutoModelForCausalLM.from_pretrained(folder, distributed_config=tp, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = _batch()
    for step in range(STEPS):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print(json.dumps({"step": step, "loss": loss.item(), "grad_norm": norm.item()}), flush=True)
    if rank == 0:
        loss, norm = _unsharded_first_step(folder)
        print(json.dumps({"unsharded_loss": loss, "unsharded_grad_norm": norm}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
