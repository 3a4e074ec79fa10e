"""The split training step: gradient accumulation and fp16 loss scaling with fused sparse optimizers.

FBGEMM applies the embedding tables' optimizer inside backward, so neither N backward passes (N
updates instead of one) nor a scaled loss (the update would use the scaled gradient) can be used as
they are. The split step runs one optimizer step over a batch of ``N * train.batch_size`` samples:

1. the sharded embedding modules look the whole batch up once (input dist, lookup, output dist);
2. the dense part runs micro-batch by micro-batch on slices of those pooled embeddings, each loss
   scaled by ``1/N`` (and by the loss scale with fp16); dense gradients accumulate, DDP all-reduces
   once, at the last micro-batch;
3. the gradient of the pooled embeddings (accumulated over the micro-batches, unscaled) flows back
   through the embedding modules once: the fused optimizer applies the N-times-larger batch's gradient,
   exactly once;
4. the dense optimizer steps (clipping sees unscaled gradients).

With fp16 a step whose gradients hold inf/nan on any rank is skipped on every rank (dense and sparse)
and the loss scale backs off; after ``growth_interval`` good steps it grows, as ``torch.amp.GradScaler``.
Dense activations are held for one micro-batch at a time; pooled embeddings for the whole batch.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch
from torchrec.distributed.types import Awaitable
from torchrec.sparse.jagged_tensor import KeyedTensor

from runner.config.errors import ConfigError
from runner.config.schema import loss_scaling_enabled

if TYPE_CHECKING:
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.keyed import CombinedOptimizer

    from runner.config.schema import PrecisionSchema


@dataclass
class LossScale:
    """Dynamic loss scale with ``torch.amp.GradScaler``'s settings and rules."""

    scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    good_steps: int = 0
    skipped: int = 0

    def state_dict(self) -> Dict[str, float]:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped": self.skipped}

    @staticmethod
    def state_fault(state: Any) -> Optional[str]:
        """What of a saved state (a checkpoint's) :meth:`load_state_dict` cannot take as a scaler's (None: nothing):
        the scale a positive finite number, the step counts whole and at least 0."""
        if not isinstance(state, dict):
            return f"loss_scale={state!r} is not a loss scaler's state"
        scale, counts = state.get("scale"), [state.get(k) for k in ("good_steps", "skipped")]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
            return f"loss_scale.scale={scale!r} is not a positive finite scale"
        if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 2**62 for c in counts):
            return f"loss_scale's step counts {counts!r} are not counts"
        return None

    def load_state_dict(self, state: Dict[str, float]) -> None:
        self.scale, self.good_steps, self.skipped = float(state["scale"]), int(state["good_steps"]), int(
            state["skipped"])

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped += 1
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0


def loss_scale_for(precision: PrecisionSchema) -> LossScale | None:
    """The dynamic loss scale ``precision.grad_scaler`` asks for (on by default with float16 autocast)."""
    if not loss_scaling_enabled(precision):
        return None
    g = precision.grad_scaler
    return LossScale(g.init_scale, g.growth_factor, g.backoff_factor, g.growth_interval)


class Unpaused:
    """A step that keeps no hold on the model between calls: the training loop's pause (``detach`` before
    evaluating or saving outside the step, ``attach`` after) has nothing to do. TorchRec's sparse pipeline
    has its own."""

    def detach(self) -> None:
        pass

    def attach(self, model: torch.nn.Module) -> None:
        pass


class SplitStep(Unpaused):
    """``progress(it) -> (loss, logits, labels)`` like TorchRec's pipeline, one optimizer step a call.

    Each embedding module must receive the batch's ``sparse_features`` unchanged (true of every model
    family here). Tables sharded ``data_parallel`` are refused: their gradients are DDP's, not the
    fused kernel's, and would be all-reduced outside DDP's forward.
    """

    def __init__(self, dmp: DistributedModelParallel, optimizer: CombinedOptimizer, device: torch.device,
                 micro_batches: int, loss_scale: LossScale | None) -> None:
        from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

        self.dmp, self.optimizer, self.device = dmp, optimizer, device
        self.micro_batches, self.loss_scale = micro_batches, loss_scale
        self.embedding_modules = [m for m in dmp.modules() if isinstance(m, ShardedEmbeddingBagCollection)]
        plan_types = {ps.sharding_type for module_plan in dmp.plan.plan.values() for ps in module_plan.values()}
        if "data_parallel" in plan_types:
            raise ConfigError("sharding", "a plan with data_parallel tables",
                              "tables sharded by TorchRec (no data_parallel) with train.grad_accumulation_steps > 1"
                              " or fp16 loss scaling")
        wrapped = getattr(dmp, "_dmp_wrapped_module", None)
        self._ddp = wrapped if hasattr(wrapped, "no_sync") else None
        self._dense = list(optimizer.optimizers[1][1].params.values())  # (name, ClippedOptimizer)

    def progress(self, it: Iterator[Batch]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch = next(it).to(self.device, non_blocking=True)  # from pinned memory: no wait on the copy
        n = self.micro_batches
        size = batch.labels.shape[0]
        if size % n:
            raise ValueError(f"a batch of {size} samples does not split into {n} micro-batches")
        micro = size // n
        self.optimizer.zero_grad()
        # 1. one lookup of the whole batch per embedding module
        pooled: List[Tuple[KeyedTensor, torch.Tensor]] = []
        for module in self.embedding_modules:
            out = module(batch.sparse_features)
            kt = out.wait() if isinstance(out, Awaitable) else out
            pooled.append((kt, kt.values().detach().requires_grad_()))
        scale = self.loss_scale.scale if self.loss_scale else 1.0
        losses, logits, labels = [], [], []
        originals = [m.forward for m in self.embedding_modules]
        try:  # 2. the dense part, micro-batch by micro-batch, on slices of the pooled embeddings
            for i in range(n):
                rows = slice(i * micro, (i + 1) * micro)
                for module, (kt, leaf) in zip(self.embedding_modules, pooled, strict=True):
                    module.forward = _replay(kt, leaf[rows])
                part = Batch(dense_features=batch.dense_features[rows], sparse_features=batch.sparse_features,
                             labels=batch.labels[rows])
                sync = self._ddp.no_sync() if self._ddp is not None and i < n - 1 else contextlib.nullcontext()
                with sync:
                    loss, (_, out_logits, out_labels) = self.dmp(part)  # autocast: models.autocast_forward
                    (loss.float() * (scale / n)).backward()
                losses.append(loss.detach().float())
                logits.append(out_logits)
                labels.append(out_labels)
        finally:
            for module, forward in zip(self.embedding_modules, originals, strict=True):
                module.forward = forward
        # 3. unscale; with loss scaling, agree across ranks whether the step is finite
        grads = [leaf.grad for _, leaf in pooled if leaf.grad is not None]
        if self.loss_scale is not None:
            found = torch.zeros(1, device=self.device)
            dense_grads = [p.grad for p in self._dense if p.grad is not None]
            inv = torch.full((1,), 1.0 / scale, device=self.device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads + dense_grads, found, inv)
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
            finite = found.item() == 0
            self.loss_scale.update(not finite)
            if not finite:
                self.optimizer.zero_grad()
                return torch.stack(losses).mean(), torch.cat(logits), torch.cat(labels)
        # 4. the embeddings' gradient back through the sharded modules once (FBGEMM updates), then dense
        for (kt, leaf) in pooled:
            if leaf.grad is not None:
                kt.values().backward(leaf.grad)
        self.optimizer.step()
        return torch.stack(losses).mean(), torch.cat(logits), torch.cat(labels)


def _replay(kt: KeyedTensor, values: torch.Tensor) -> Any:
    """A forward that returns this micro-batch's rows of the already looked-up pooled embeddings."""

    def forward(*_args: Any, **_kwargs: Any) -> KeyedTensor:
        return KeyedTensor(keys=kt.keys(), length_per_key=kt.length_per_key(), values=values, key_dim=1)

    return forward
