"""Which parts of torch a text points at (DTensor, FSDP, compile, ...): a *possibly* answer is given
only where the error points at the part of torch that has the bug, since a message that plain-tensor
code prints too proves nothing by itself."""

from __future__ import annotations

import re

__all__ = ["pointed_at"]

# Each part: the words, modules and paths that name it in a traceback, a message or a bug's title.
_PARTS = {
    "dtensor": r"DTensor|distributed[/.]tensor|DeviceMesh|device_mesh|_StridedShard|\b(?:Shard|Replicate|Partial)\(|"
    r"sharding (?:strategy|propagation)|redistribute|loss_parallel|parallelize_module|tensor parallel|\bTP\b",
    "fsdp": r"FSDP|fsdp|fully_shard",
    "compile": r"compile|[Dd]ynamo|[Ii]nductor|_functorch|aot_autograd|AOTAutograd|aot_eager|AOT|FakeTensor|"
    r"torch[/.]fx|graph break|unbacked|SymInt|torch[/.]_subclasses|autograd\.Function",
    "pipelining": r"pipelining|PipelineStage|PipelineSchedule|Schedule(?:1F1B|GPipe|Interleaved)",
    # Context parallelism swaps SDPA for its own sharded attention: an SDPA op without a sharding strategy is
    # a CP bug only where the text speaks of CP.
    "context-parallel": r"context_parallel|[Cc]ontext[ -][Pp]arallel|\[CP\]|\bCP\b",
    "dcp": r"distributed[/.]checkpoint|ChunkStorageMetadata|global plan|\bDCP\b|\bdcp\b|state_dict|safetensors|"
    r"optim_state",
    "checkpoint": r"utils[/.]checkpoint|CheckpointError|activation checkpoint|recompute|\bSAC\b|checkpoint_wrapper",
    "c10d": r"c10d|ProcessGroup|process group|new_group|init_process_group|TCPStore|[Nn][Cc][Cc][Ll]|[Gg]loo",
}
_COMPILED = {name: re.compile(words) for name, words in _PARTS.items()}


def pointed_at(text: str) -> frozenset[str]:
    """The parts of torch that ``text`` names."""
    return frozenset(name for name, words in _COMPILED.items() if words.search(text))
