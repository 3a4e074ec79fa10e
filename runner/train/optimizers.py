"""Optimizers: FBGEMM's fused sparse optimizers, the dense optimizer, schedules and clipping.

Embedding tables get their optimizer inside backward (``apply_optimizer_in_backward``; TorchRec maps
the class onto an FBGEMM fused kernel). The dense parameters get a torch optimizer, wrapped so that
the training pipeline's ``step()`` clips first. Learning rates follow a schedule, set before each step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, Iterable, Tuple, cast

import torch
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from runner.config.optimizer_kinds import DENSE, SCHEDULES, SPARSE
from runner.config.parts import part

if TYPE_CHECKING:
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from runner.config.schema import ClipSchema, OptimizerSchema, ScheduleSchema


def sparse_parameters(model: torch.nn.Module) -> Any:
    """Parameters of the embedding tables (they get the fused optimizer)."""
    return (p for n, p in model.named_parameters() if "embedding_bag_collection" in n)


def sparse_optimizer(o: OptimizerSchema) -> Tuple[type, Dict[str, Any]]:
    """Optimizer class and kwargs that TorchRec maps onto an FBGEMM fused optimizer."""
    from torchrec import optim as trec

    from runner.runtime.moved_names import weight_decay_mode

    declared = SPARSE[o.sparse]
    kwargs: Dict[str, Any] = {"lr": o.sparse_lr * lr_factor(o.sparse_schedule, 1, 1)}
    if declared.eps:
        kwargs["eps"] = o.sparse_eps
    if o.sparse_weight_decay > 0:
        kwargs["weight_decay"] = o.sparse_weight_decay
        modes = weight_decay_mode()
        kwargs["weight_decay_mode"] = (modes.DECOUPLE if o.sparse_weight_decay_mode == "decoupled" else modes.L2)
    return getattr(trec, declared.torchrec_class), kwargs


def apply_sparse_optimizer(model: torch.nn.Module, opt_cfg: OptimizerSchema) -> None:
    """Mark the embedding tables for the fused optimizer (before sharding: planner and sharder read it)."""
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    cls, kwargs = sparse_optimizer(opt_cfg)
    apply_optimizer_in_backward(cls, sparse_parameters(model), kwargs)


def mark_sparse_optimizer(model: torch.nn.Module, opt_cfg: OptimizerSchema) -> None:
    """What :func:`apply_sparse_optimizer` leaves on each table that TorchRec's planner and sharders read (the
    optimizer's class and keyword arguments, as ``apply_optimizer_in_backward`` records them), without building an
    optimizer per table: for a model that is only planned (on the meta device; 20,000 tables took 11 s to get
    their optimizers). ``tests/plan/test_planning.py`` checks TorchRec enumerates the same options after either."""
    cls, kwargs = sparse_optimizer(opt_cfg)
    for param in sparse_parameters(model):
        setattr(param, "_optimizer_classes", [cls])  # noqa: B010 - torch's attribute names, listed in the seam test
        setattr(param, "_optimizer_kwargs", [kwargs])  # noqa: B010


class ClippedOptimizer(KeyedOptimizerWrapper):
    """The dense optimizer; its ``step()`` clips the (already all-reduced) gradients first."""

    def __init__(self, params: Dict[str, torch.nn.Parameter], make: Any, clip: ClipSchema) -> None:
        super().__init__(params, make)
        # chosen once: the config node's attribute lookups are OmegaConf's, on every step
        self._clip, self._clip_max = CLIPS.get(str(clip.kind)), float(clip.max)

    def step(self, closure: Any = None) -> None:
        if self._clip is not None:
            self._clip([p for p in self.params.values() if p.grad is not None], self._clip_max)
        super().step(closure)


CLIPS = {"norm": torch.nn.utils.clip_grad_norm_, "value": torch.nn.utils.clip_grad_value_}
"""``optimizer.clip.kind``'s clipping of the dense gradients (``none``: none)."""


def dense_optimizer(model: torch.nn.Module, o: OptimizerSchema) -> KeyedOptimizerWrapper:
    """The dense optimizer over every parameter not already updated in backward."""
    params = dict(in_backward_optimizer_filter(model.named_parameters()))
    lr = o.dense_lr * lr_factor(o.dense_schedule, 1, 1)

    declared = DENSE[o.dense]
    kwargs: Dict[str, Any] = {"lr": lr, "weight_decay": o.dense_weight_decay}
    if declared.fused:  # None: torch's own choice (foreach on a GPU, a loop on CPU)
        kwargs["fused"] = True if o.dense_fused else None
    if declared.eps:
        kwargs["eps"] = o.dense_eps
    if declared.momentum:
        kwargs["momentum"] = o.dense_momentum

    def make(p: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return getattr(torch.optim, declared.torch_class)(p, **kwargs)

    return ClippedOptimizer(params, make, o.clip)


def combined_optimizer(dmp: DistributedModelParallel, opt_cfg: OptimizerSchema) -> CombinedOptimizer:
    return CombinedOptimizer([("sparse", dmp.fused_optimizer), ("dense", dense_optimizer(dmp, opt_cfg))])


def lr_factor(s: ScheduleSchema, step: int, total: int) -> float:
    """Multiplier of the base learning rate at 1-based ``step`` of ``total``: linear warm-up, then the schedule
    ``s.name`` declares (:mod:`runner.config.optimizer_kinds`)."""
    if s.warmup_steps and step <= s.warmup_steps:
        return step / s.warmup_steps
    return float(part(SCHEDULES[s.name].factor)(s, step, step - s.warmup_steps, max(total - s.warmup_steps, 1)))


def constant_factor(s: ScheduleSchema, step: int, t: int, span: int) -> float:
    return 1.0


def exp_decay_factor(s: ScheduleSchema, step: int, t: int, span: int) -> float:
    return max(s.min_factor, s.decay_rate ** (t / s.decay_steps))


def steps_factor(s: ScheduleSchema, step: int, t: int, span: int) -> float:
    return s.gamma ** sum(1 for m in s.milestones if step >= m)


def cosine_factor(s: ScheduleSchema, step: int, t: int, span: int) -> float:
    progress = min(t / span, 1.0)
    return s.min_factor + (1 - s.min_factor) * 0.5 * (1 + math.cos(math.pi * progress))


def _leaves(optimizer: torch.optim.Optimizer) -> Iterable[Any]:
    children = getattr(optimizer, "optimizers", None)
    if children is None:
        yield optimizer
        return
    for _, child in children:
        yield from _leaves(child)


def scheduled_rates(o: OptimizerSchema, step: int, total: int) -> Tuple[float, float]:
    """(sparse, dense) learning rates of 1-based ``step`` of ``total``."""
    sparse = o.sparse_lr * lr_factor(o.sparse_schedule, step, total)
    return sparse, o.dense_lr * lr_factor(o.dense_schedule, step, total)


class Schedule:
    """:func:`scheduled_rates` over plain Python copies of the optimizer config, for the training loop.

    Reading an OmegaConf node costs microseconds per attribute: read from the config every step, the
    schedule cost a noticeable share of a CPU step of the default model (docs/benchmarks.md).
    """

    def __init__(self, opt_cfg: OptimizerSchema, total: int) -> None:
        from types import SimpleNamespace

        from omegaconf import OmegaConf

        def plain(node: Any) -> Any:
            return SimpleNamespace(**cast(Dict[str, Any], OmegaConf.to_container(node, resolve=True)))

        self._o: Any = SimpleNamespace(sparse_lr=float(opt_cfg.sparse_lr), dense_lr=float(opt_cfg.dense_lr),
                                  sparse_schedule=plain(opt_cfg.sparse_schedule),
                                  dense_schedule=plain(opt_cfg.dense_schedule))
        self._total = total

    def __call__(self, step: int) -> Tuple[float, float]:
        return scheduled_rates(self._o, step, self._total)


def set_learning_rates(optimizer: CombinedOptimizer, sparse_lr: float, dense_lr: float) -> Tuple[float, float]:
    """Apply the rates to both parts before a step runs; returns them.

    FBGEMM's fused kernels read their rate when the optimizer steps, which is after the backward that
    uses it; setting it on the kernel directly makes the coming step use its own rate.
    """
    (_, sparse), (_, dense) = optimizer.optimizers
    for group in sparse.param_groups:
        group["lr"] = sparse_lr
    for leaf in _leaves(sparse):
        emb = getattr(leaf, "_emb_module", None)
        if emb is not None:
            emb.set_learning_rate(sparse_lr)
    for group in dense.param_groups:
        group["lr"] = dense_lr
    return sparse_lr, dense_lr
