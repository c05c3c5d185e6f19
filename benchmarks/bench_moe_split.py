"""The MoE expert for-loop (torchtitan's `_run_experts_for_loop`) compiled with inductor vs eager.

Forward + backward of one MoE layer's experts over routed tokens whose per-expert counts change
every step (`counts.tolist()` sizes are unbacked, so one compiled graph serves all of them).
Prints the median step time of each and the compiled/eager ratio (< 1 means compiled is faster).
Compile time is reported apart and not part of the ratio. ``--smoke`` runs a tiny layer with
the aot_eager backend for two steps: that the benchmark runs, in seconds, not what it measures.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch_overlay  # noqa: E402,F401  # the fixes this loop needs on older torch

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


SMOKE = "--smoke" in sys.argv[1:]
NUM_EXPERTS = 4 if SMOKE else 8
DIM = 16 if SMOKE else 256
HIDDEN = 32 if SMOKE else 512
TOKENS = 64 if SMOKE else 2048  # routed tokens per step, padding included
WARMUP = 1 if SMOKE else 3
ITERS = 2 if SMOKE else 15
BACKEND = "aot_eager" if SMOKE else "inductor"


def experts_for_loop(w1, w2, w3, x, num_tokens_per_expert):
    sizes = num_tokens_per_expert.tolist()
    num_tokens = sum(sizes)
    outs = []
    for i, x_expert in enumerate(torch.split(x[:num_tokens], sizes, dim=0)):
        h = F.silu(x_expert @ w1[i].transpose(-2, -1))
        h = h * (x_expert @ w3[i].transpose(-2, -1))
        outs.append(h @ w2[i].transpose(-2, -1))
    out = torch.cat(outs, dim=0)
    return torch.vstack((out, out.new_zeros((x.shape[0] - num_tokens, out.shape[-1]))))


def routed_counts(generator: torch.Generator) -> torch.Tensor:
    # Skewed routing with some idle experts; about 90% of the rows are real tokens.
    logits = torch.randn(NUM_EXPERTS, generator=generator) * 1.5
    logits[torch.randperm(NUM_EXPERTS, generator=generator)[:2]] = -30.0
    probs = torch.softmax(logits, 0)
    return torch.distributions.Multinomial(int(TOKENS * 0.9), probs).sample().long()


def step_ms(fn, weights, inputs) -> float:
    times = []
    for i, (x, counts) in enumerate(inputs):
        start = time.perf_counter()
        fn(*weights, x, counts).sum().backward()
        if i >= WARMUP:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    torch.manual_seed(0)
    torch._dynamo.config.capture_scalar_outputs = True
    weights = [
        (torch.randn(NUM_EXPERTS, *shape) * 0.05).requires_grad_()
        for shape in ((HIDDEN, DIM), (DIM, HIDDEN), (HIDDEN, DIM))
    ]
    generator = torch.Generator().manual_seed(0)
    inputs = [(torch.randn(TOKENS, DIM, requires_grad=True), routed_counts(generator)) for _ in range(WARMUP + ITERS)]

    compiled = torch.compile(experts_for_loop, backend=BACKEND, fullgraph=True)
    start = time.perf_counter()
    compiled(*weights, *inputs[0]).sum().backward()
    compile_s = time.perf_counter() - start

    # Alternate so that both see the same machine load.
    eager = compiled_ms = float("inf")
    for _ in range(2):
        eager = min(eager, step_ms(experts_for_loop, weights, inputs))
        compiled_ms = min(compiled_ms, step_ms(compiled, weights, inputs))
    print(
        f"moe expert loop fwd+bwd ({BACKEND}, E={NUM_EXPERTS}, tokens={TOKENS}, dim={DIM}, "
        f"hidden={HIDDEN}, torch {torch.__version__}, {torch.get_num_threads()} threads): "
        f"eager {eager:.2f} ms, compiled {compiled_ms:.2f} ms, "
        f"compiled/eager ratio {compiled_ms / eager:.2f} (compile {compile_s:.0f} s)"
    )


if __name__ == "__main__":
    main()
