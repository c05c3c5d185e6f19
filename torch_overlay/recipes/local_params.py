"""Run a module on plain local views of its DTensor parameters, refreshed on every call.

Some modules cannot take DTensor parameters: their forward or a custom ``autograd.Function``
inside it works on plain tensors (HF routers such as PhiMoE's sparsemixer call ``scatter_add_``
in their backward). Under tensor parallelism such a module is typically replicated on the TP
mesh, so it can run on ``param.to_local()``. Doing that by shadowing ``module.__dict__[name]``
from a forward pre-hook (torchtitan#3122) goes wrong three ways: the shadow is read back as the
parameter on the next call and never refreshed; the shadow outlives the call; and under
``torch.compile`` the hook's ``to_local()`` becomes a graph output, which on torch <= 2.15 without
the ``aot-fresh-alias-outputs`` fix hands back the parameter's own local tensor and stamps a
``grad_fn`` on it.

:func:`use_local_param_views` wraps the module's ``forward`` instead: on each call it takes fresh
``to_local(grad_placements=...)`` views of the DTensor parameters, exposes them as the module's
attributes for the duration of the call only, and removes them in ``finally``. The views are made
inside the traced frame, so under ``torch.compile`` they are graph intermediates, never outputs.

Gradient placements: the view's gradient comes back to the DTensor parameter with the placements
given here (default: the parameter's own). For a parameter replicated on a mesh dimension whose
ranks see *different* data (sequence-parallel or otherwise split tokens), each rank's gradient
is only its share: pass ``Partial()`` for that dimension, or the replicas silently diverge
(torchtitan#2387). Ranks that see the same data produce the full gradient: keep ``Replicate()``.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Placement

__all__ = ["LocalParamViewsHandle", "use_local_param_views"]

GradPlacements = Sequence[Placement] | Mapping[str, Sequence[Placement]] | None

# Where the wrapper keeps its state on the module (an instance attribute, so deepcopy and
# pickling carry it with the module and rebind it to the copy).
_STATE_ATTR = "_local_param_views_state"


@dataclass
class _State:
    inner_forward: Any  # the forward that ran before; a bound method of the module or None
    grad_placements: dict[str, tuple[Placement, ...]]  # by parameter FQN, DTensor params only


class LocalParamViewsHandle:
    """Returned by :func:`use_local_param_views`; ``remove()`` restores the module's forward."""

    def __init__(self, module: nn.Module) -> None:
        self._module = module

    def remove(self) -> None:
        module = self._module
        state = module.__dict__.pop(_STATE_ATTR, None)
        if state is None:
            return
        del module.__dict__["forward"]
        if state.inner_forward is not None:
            module.__dict__["forward"] = state.inner_forward


def _resolve_grad_placements(module: nn.Module, grad_placements: GradPlacements) -> dict[str, tuple[Placement, ...]]:
    params = {name: p for name, p in module.named_parameters() if isinstance(p, DTensor)}
    if not params:
        raise ValueError(f"{type(module).__name__} has no DTensor parameters")
    if grad_placements is None:
        chosen = {name: tuple(p.placements) for name, p in params.items()}
    elif isinstance(grad_placements, Mapping):
        unknown = sorted(set(grad_placements) - set(params))
        if unknown:
            raise ValueError(f"grad_placements names no DTensor parameter: {unknown}")
        chosen = {name: tuple(grad_placements.get(name, p.placements)) for name, p in params.items()}
    else:
        chosen = {name: tuple(grad_placements) for name in params}
    for name, placements in chosen.items():
        ndim = params[name].device_mesh.ndim
        if len(placements) != ndim or not all(isinstance(p, Placement) for p in placements):
            raise ValueError(f"grad_placements for {name!r} must be {ndim} Placement(s), got {placements}")
    return chosen


def _forward_with_local_views(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    state: _State = self.__dict__[_STATE_ATTR]
    shadowed: list[tuple[nn.Module, str]] = []
    try:
        for fqn, placements in state.grad_placements.items():
            owner_name, _, name = fqn.rpartition(".")
            owner = self.get_submodule(owner_name)
            # Read the registered parameter, not the attribute: the attribute is the shadow.
            param = owner._parameters[name]
            owner.__dict__[name] = param.to_local(grad_placements=placements)
            shadowed.append((owner, name))
        if state.inner_forward is not None:
            return state.inner_forward(*args, **kwargs)
        return type(self).forward(self, *args, **kwargs)
    finally:
        for owner, name in shadowed:
            # Not `owner.__dict__.pop(name)`: dynamo 2.12 replays that as a delattr of the
            # module, which unregisters the parameter itself.
            if name in owner.__dict__:
                object.__delattr__(owner, name)


def use_local_param_views(module: nn.Module, grad_placements: GradPlacements = None) -> LocalParamViewsHandle:
    """Make ``module`` (and its submodules) see plain local views of its DTensor parameters.

    Each call of ``module`` takes ``p.to_local(grad_placements=...)`` of every DTensor parameter
    under it, sets the views as attributes of their owning modules, runs the forward, and removes
    them again, also when the forward raises. Parameters, state dict keys and FQNs do not change;
    optimizers and checkpoints keep seeing the DTensor parameters. Works in eager and when the
    module (or its caller) is compiled.

    Args:
        module: the module to wrap; install this before ``module.compile()``.
        grad_placements: the placements the gradients come back with, as one sequence for every
            DTensor parameter or a mapping from parameter FQN (relative to ``module``) to a
            sequence; parameters left out keep their own placements. Use ``Partial()`` on mesh
            dimensions whose ranks feed the module different data.

    Returns:
        a handle whose ``remove()`` restores the module's previous forward.
    """
    if _STATE_ATTR in module.__dict__:
        raise RuntimeError(f"use_local_param_views is already active on {type(module).__name__}")
    state = _State(
        inner_forward=module.__dict__.get("forward"),
        grad_placements=_resolve_grad_placements(module, grad_placements),
    )
    module.__dict__[_STATE_ATTR] = state
    module.__dict__["forward"] = types.MethodType(_forward_with_local_views, module)
    return LocalParamViewsHandle(module)
