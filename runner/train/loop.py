"""The training loop: one optimizer step per batch, metrics every ``train.log_every`` steps, checkpoints
when due; every rank stops at the same step when the data ends.

The step is the TorchRec pipeline ``train.pipeline`` declares (:mod:`runner.config.pipelines`), or the split step
(:mod:`.split_step`) when accumulating micro-batches or scaling an fp16 loss. The loop reads no OmegaConf
node per step (each read costs microseconds): schedule and settings are copied to plain Python first.
"""

from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional

import torch
import torch.distributed as dist
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

from runner.config.errors import TrainingError
from runner.config.pipelines import PIPELINES
from runner.config.schema import samples_per_step
from runner.train.optimizers import Schedule, set_learning_rates
from runner.train.pipeline_classes import pipeline_class
from runner.train.split_step import LossScale, SplitStep, Unpaused

if TYPE_CHECKING:
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.keyed import CombinedOptimizer

    from runner.config.schema import OptimizerSchema, TrainSchema


def make_step(dmp: DistributedModelParallel, optimizer: CombinedOptimizer, device: torch.device, settings: TrainSchema,
              loss_scale: Optional[LossScale]) -> Any:
    """The TorchRec pipeline ``settings.pipeline`` declares; the split step when accumulating micro-batches or
    scaling the loss (validation allows that only where the declaration does)."""
    if settings.grad_accumulation_steps > 1 or loss_scale is not None:
        return SplitStep(dmp, optimizer, device, settings.grad_accumulation_steps, loss_scale)
    declared = PIPELINES[settings.pipeline]
    options = dict(declared.options, **{arg: getattr(settings, key) for arg, key in declared.from_train})
    return pipeline_class(declared)(dmp, optimizer, device, **options)


@dataclass
class TrainResult:
    losses: List[float] = field(default_factory=list)
    steps: List[int] = field(default_factory=list)
    first_step_unix: Optional[float] = None
    final_loss: float = float("nan")
    samples_per_s: float = 0.0
    step_time_ms: float = 0.0
    faults_per_step: float = 0.0  # the process's minor page faults per timed step (pages first touched)
    last_step: int = 0
    data_ended: bool = False
    stopped_at: Optional[int] = None  # where a checkpoint's evaluation stopped the training (a pruned trial)


def device_sync(device: torch.device) -> Callable[[], None]:
    """What waits for ``device`` to finish the work queued on it: CUDA's synchronize; nothing on CPU."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _task_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each task's BCE of one step (multi-task models: logits and labels are (batch, tasks))."""
    return torch.nn.functional.binary_cross_entropy_with_logits(
        logits.float(), labels.float().reshape(logits.shape), reduction="none").mean(0)


class _Window:
    """The steps since the last log: their summed losses and wall time (checkpoint pauses excluded).

    Losses are summed where they are computed (on a GPU: on the GPU, in float64), so that no step waits
    for the device; they are read once per window. Also keeps the run's timed total over every window
    but the first, which holds the pipeline's tracing (unless it is the only one).
    """

    def __init__(self, tasks: int, device: torch.device) -> None:
        self.tasks, self.device = tasks, device
        self.sync = device_sync(device)
        self.timed_s, self.timed_steps, self.timed_faults, self._first = 0.0, 0, 0, True
        self._reset(time.perf_counter())

    def _reset(self, now: float) -> None:
        self.sums = torch.zeros(1 + self.tasks, dtype=torch.float64, device=self.device)  # loss, then each task's
        self.losses: List[torch.Tensor] = []  # each step's loss, summed at the window's end (one op per step)
        self.steps, self.start, self.paused = 0, now, 0.0
        self.faults_at = resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def add(self, loss: torch.Tensor, task_losses: Optional[torch.Tensor]) -> None:
        self.losses.append(loss.detach())
        if task_losses is not None:
            self.sums[1:] += task_losses.double()
        self.steps += 1

    def first_nonfinite(self) -> torch.Tensor:
        """This window's [index of its first step whose loss is not finite (its step count when none), its
        finite steps], a tensor on the device: no read, so no step waits for it."""
        if not self.losses:
            return torch.zeros(2, dtype=torch.int64, device=self.device)
        finite = torch.isfinite(torch.stack(self.losses))
        steps = torch.arange(len(self.losses), device=self.device)
        return torch.stack([torch.where(finite, len(self.losses), steps).min(), finite.sum()])

    def close(self, last: bool) -> tuple:
        """End the window: (the summed losses divided by its steps, as a tensor; steps; seconds); start the
        next. The clock is read once the device has done the window's work (CUDA runs it asynchronously)."""
        self.sync()
        now = time.perf_counter()
        elapsed = now - self.start - self.paused  # wall time of the window: logging included, pauses not
        if not self._first or last and self.timed_steps == 0:
            self.timed_s, self.timed_steps = self.timed_s + elapsed, self.timed_steps + self.steps
            self.timed_faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.faults_at
        self._first = False
        if self.losses:
            self.sums[0] = torch.stack(self.losses).double().sum()  # scalars: backward() takes no other
        means, steps = self.sums / self.steps, self.steps
        self._reset(now)
        return means, steps, elapsed


@dataclass
class LoopHooks:
    """What the loop reports to and asks of its caller; every rank calls each at the same steps."""

    on_log: Callable[[int, Dict[str, float]], None]
    progress: Any
    due: Callable[[int], bool] = lambda step: False
    on_checkpoint: Optional[Callable[[int], None]] = None
    stopped: Callable[[], bool] = lambda: False  # asked after each checkpoint: stop training there


def _stop_nonfinite(found: torch.Tensor, window_start: int, mean: float, result: TrainResult,
                    loss_scale: Optional[LossScale]) -> None:
    """Raise the one line of a loss that became NaN or infinite (every rank the same: the window's mean is
    all-reduced, and so is ``found``: :meth:`_Window.first_nonfinite`), unless fp16's loss scaler is skipping
    single steps."""
    dist.all_reduce(found, op=dist.ReduceOp.MIN)
    first, finite = found.tolist()
    if loss_scale is not None and finite > 0:
        return  # finite steps in the window on every rank: the scaler's skipped steps, as fp16 has them
    what = "NaN" if mean != mean else "infinite"
    last = next(((s, v) for s, v in zip(reversed(result.steps), reversed(result.losses), strict=True)
                 if math.isfinite(v)), None)
    since = f"the last finite logged loss {last[1]:.4f} at step {last[0]}" if last else "no finite loss logged before"
    raise TrainingError(
        f"the training loss became {what} at step {window_start + first} ({since}): lower optimizer.dense_lr "
        "and optimizer.sparse_lr, clip gradients (optimizer.clip.kind=norm), or train in fp32 or bf16 "
        "(precision=fp32); train.stop_on_nonfinite=false trains on")


def _log(window: _Window, step: int, last: bool, rates: tuple, tasks: List[str], samples: int,
         loss_scale: Optional[LossScale], result: TrainResult, hooks: LoopHooks, check_finite: bool = True) -> None:
    """Close the window: its metrics, averaged over ranks, to ``hooks.on_log`` and the result; a loss that is
    not finite ends the job (``check_finite``, :func:`_stop_nonfinite`)."""
    first = window.steps
    nonfinite = window.first_nonfinite() if check_finite else None  # before close() resets the window
    window_means, steps, elapsed = window.close(last)
    dist.all_reduce(window_means)
    means = (window_means / dist.get_world_size()).tolist()  # the host waits for the device here, at log steps only
    if check_finite and not math.isfinite(means[0]):
        _stop_nonfinite(nonfinite, step - first + 1, means[0], result, loss_scale)
    metrics = {"train/loss": means[0], "train/samples_per_s": samples * steps / max(elapsed, 1e-9),
               "train/lr_dense": rates[1], "train/lr_sparse": rates[0]}
    if len(tasks) > 1:
        metrics.update({f"train/{t}/loss": v for t, v in zip(tasks, means[1:], strict=True)})
    if loss_scale is not None:
        metrics["train/loss_scale"] = float(loss_scale.scale)
        metrics["train/skipped_steps"] = float(loss_scale.skipped)
    result.losses.append(means[0])
    result.steps.append(step)
    hooks.progress.set_postfix(loss=f"{means[0]:.4f}", refresh=False)
    hooks.on_log(step, metrics)


def _pause_for_checkpoint(pipeline: Unpaused | TrainPipelineSparseDist, dmp: torch.nn.Module, step: int,
                          hooks: LoopHooks) -> float:
    """Evaluate and save outside the pipeline; the seconds it took (left out of the timing)."""
    t0 = time.perf_counter()
    pipeline.detach()  # evaluation and saving run the model outside the pipeline
    assert hooks.on_checkpoint is not None  # paused only where the loop has a checkpoint to make
    hooks.on_checkpoint(step)
    dmp.train()
    pipeline.attach(dmp)
    return time.perf_counter() - t0


def train(dmp: DistributedModelParallel, optimizer: CombinedOptimizer, batches: Iterable, start: int, steps: int,
          device: torch.device, settings: TrainSchema, optimizers: OptimizerSchema, tasks: List[str], hooks: LoopHooks,
          loss_scale: Optional[LossScale] = None) -> TrainResult:
    """Run steps ``start+1 .. steps`` (fewer when the data ends first: then every rank stops at the same
    step), ``settings`` being ``train``'s keys, ``optimizers`` the learning rates' schedule, ``tasks`` the model's.
    Every ``train.log_every`` steps report metrics; at steps where ``hooks.due(step)``, hand the model to
    ``hooks.on_checkpoint`` (outside the pipeline). ``loss_scale`` (fp16) is updated in place, so that
    checkpoints can save it."""
    result = TrainResult(last_step=start)
    if start >= steps:
        return result
    pipeline = make_step(dmp, optimizer, device, settings, loss_scale)
    it = iter(batches)
    dmp.train()
    samples = dist.get_world_size() * samples_per_step(settings)
    schedule, log_every = Schedule(optimizers, steps), settings.log_every
    window, applied = _Window(len(tasks), device), (float("nan"), float("nan"))
    check = settings.stop_on_nonfinite
    for step in range(start + 1, steps + 1):
        rates = schedule(step)
        if rates != applied:  # constant schedules touch the optimizers once
            applied = set_learning_rates(optimizer, *rates)
        try:
            loss, logits, labels = pipeline.progress(it)  # the forward under autocast: models.autocast_forward
        except StopIteration:  # every rank's data check said: some rank has no batch left
            result.data_ended = True
            break
        result.last_step = step
        window.add(loss, _task_losses(logits, labels) if len(tasks) > 1 else None)
        if result.first_step_unix is None:
            window.sync()  # when the first step was done, not queued
            result.first_step_unix = time.time()
        hooks.progress.update(1)
        if step % log_every == 0 or step == steps:
            _log(window, step, step == steps, applied, tasks, samples, loss_scale, result, hooks, check)
        if hooks.on_checkpoint is not None and step < steps and hooks.due(step):
            window.paused += _pause_for_checkpoint(pipeline, dmp, step, hooks)
            if hooks.stopped():
                result.stopped_at = step
                break
    if window.steps:  # the data ended inside a window: the last one (timed even when it is also the first)
        _log(window, result.last_step, True, applied, tasks, samples, loss_scale, result, hooks, check)
    pipeline.detach()  # restore the model's own forward, for evaluation outside the pipeline
    result.final_loss = result.losses[-1] if result.losses else float("nan")
    result.samples_per_s = samples * window.timed_steps / max(window.timed_s, 1e-9)
    result.step_time_ms = 1000.0 * window.timed_s / max(window.timed_steps, 1)
    result.faults_per_step = window.timed_faults / max(window.timed_steps, 1)
    return result
