"""``mode=calibrate``: one rank's part. Every rank measures (:mod:`.calibrate_parts`) at once, as a job runs;
rank 0 gathers the measurements, fits them (:mod:`runner.plan.cost.cost_fit`), writes the calibration file
(:mod:`runner.plan.cost.calibration`) and its report (:mod:`runner.plan.cost.calibration_report`), and logs them.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, cast

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from runner.config.schema import samples_per_step
from runner.plan import PARTS, allowed_median_error
from runner.train.calibrate_job import step_samples
from runner.train.calibrate_parts import (
    COLLECTIVES,
    LINEAR_WIDTHS,
    SHARDED,
    collective_samples,
    dense_samples,
    input_samples,
    kernel_samples,
    kernel_shapes,
    linear_samples,
    message_sizes,
    optimizer_samples,
    scopes,
    sharded_samples,
)
from runner.train.timing import Repeats

if TYPE_CHECKING:
    from runner.config.schema import CalibrateSchema, OptimizerSchema, PrecisionSchema, RunnerConfig
    from runner.track.reporter import Reporter
    from runner.train.rank_env import RankEnv


# the sharded lookups' small batch, and their table counts beyond one: a model's tens to hundreds of features cost
# per table more than 8 tables show (TorchRec's bookkeeping per feature), so the fit reaches 64
SMALL_BATCH, MANY_TABLES, MOST_TABLES = 64, 8, 64
STEP_STEPS = 40  # steps of the tiny-table job (the loop times those after its warm-up)
# the tiny-table job's batches, as multiples of the job's: its overhead grows with the batch (2 x 2 emulated nodes on
# 2 cores: 13, 17 and 27 ms at 64, 256 and 1,024 samples), and a slope read off a quarter and the batch alone, one of
# them disturbed, put it at 69 ms at 1,024 (+82% on the step); a point at 4x spans the batches jobs use
STEP_BATCHES = (0.25, 1, 4)


def step_batches(batch: int, grid: str) -> List[int]:
    """The per-rank batches the tiny-table job is timed at: :data:`STEP_BATCHES` x ``batch`` (``grid=small``: the
    first two)."""
    span = STEP_BATCHES[:2] if grid == "small" else STEP_BATCHES
    return sorted({max(int(batch * f), 1) for f in span})


class _Progress:
    """Rank 0's progress line, at most every ``every_s`` seconds and at each phase's start."""

    def __init__(self, active: bool, every_s: float = 5.0) -> None:
        self.active, self.every_s, self.last, self.t0 = active, every_s, 0.0, time.perf_counter()

    def __call__(self, phase: str, done: int, of: int, force: bool = False) -> None:
        now = time.perf_counter()
        if self.active and (force or now - self.last >= self.every_s):
            self.last = now
            print(f"[runner] calibrate: {phase} {done} of {of} ({now - self.t0:.0f} s)", flush=True)


def repeats_for(c: CalibrateSchema) -> Repeats:
    """One part's repeats (:class:`Repeats`): ``calibrate.repeats``, more while a point's median is known less well
    than ``calibrate.max_spread`` allows at ``calibrate.repeats`` (:func:`allowed_median_error`), up to
    ``calibrate.max_repeats``, for at most an equal share of ``calibrate.max_extra_s`` from now."""
    return Repeats(c.repeats, max(c.max_repeats, c.repeats), allowed_median_error(c.max_spread, c.repeats),
                   time.perf_counter() + c.max_extra_s / len(PARTS))


def _collectives(c: CalibrateSchema, env: RankEnv, device: torch.device, say: _Progress) -> Dict[str, Any]:
    """Every collective at every size, in each scope; this rank's samples (ranks outside a group: none)."""
    sizes = message_sizes(device.type, c.grid, c.max_message_mib)
    out: Dict[str, Any] = {name: {} for name in COLLECTIVES}
    repeats = repeats_for(c)
    for scope, groups in scopes(env.world, env.local_world).items():
        made = [(members, dist.new_group(members)) for members in groups]  # every rank makes every group
        members, group = next((m, g) for m, g in made if env.rank in m)
        for i, name in enumerate(COLLECTIVES):
            say(f"collectives ({scope}-node)", i, len(COLLECTIVES), force=i == 0)
            out[name][scope] = {n: collective_samples(name, group, len(members), n, device, repeats) for n in sizes}
        dist.barrier()
    return out


def _kernels(c: CalibrateSchema, optimizer: OptimizerSchema, device: torch.device, say: _Progress, uvm: bool = False
             ) -> List[Dict[str, Any]]:
    """The embedding kernel's samples over the grid's shapes; ``uvm``: the UVM-caching kernel's, on a GPU (none
    where FBGEMM's build cannot run it here: the calibration then keeps TorchRec's host-to-GPU bandwidth, and its
    report says so)."""
    from runner.train.optimizers import sparse_optimizer

    shapes, out = kernel_shapes(c.grid, device.type), []
    repeats = repeats_for(c)
    for i, shape in enumerate(shapes):
        say("UVM-caching kernels" if uvm else "embedding kernels", i, len(shapes), force=i == 0)
        try:
            fwd, bwd = kernel_samples(shape, device, sparse_optimizer(optimizer), repeats, uvm)
        except Exception as exc:  # noqa: BLE001 - a build without UVM: the rest of the calibration stands
            if not uvm:
                raise
            print(f"[runner] calibrate: the UVM-caching kernel did not run here ({type(exc).__name__}): TorchRec's "
                  "host-to-GPU bandwidth is kept", flush=True)
            return []
        out.append({"shape": shape, "fwd": fwd, "bwd": bwd})
    return out


def _sharded(batch_size: int, optimizer: OptimizerSchema, precision: PrecisionSchema, repeats: Repeats, env: RankEnv,
             device: torch.device, say: _Progress) -> Dict[str, Any]:
    """Each family of sharded lookup over every rank: one and :data:`MANY_TABLES` tiny tables, each at a small
    batch and the job's (``batch_size``; the cost per call, per table and per table and sample), and
    :data:`MOST_TABLES` at the small batch."""
    small, job = SMALL_BATCH, max(batch_size, 2 * SMALL_BATCH)
    out = {}
    for i, kind in enumerate(SHARDED):
        say("sharded lookups", i, len(SHARDED), force=i == 0)
        out[kind] = {n: sharded_samples(optimizer, precision, kind, env.world, env.local_world, device, n, batches,
                                        repeats)
                     for n, batches in ((1, (small, job)), (MANY_TABLES, (small, job)), (MOST_TABLES, (small,)))}
    return out


def _dense(cfg: RunnerConfig, env: RankEnv, device: torch.device, say: _Progress) -> Dict[str, Any]:
    """The dense part at the job's batch, a half and a quarter of it; the optimizer over the dense parameters,
    4x and 16x as many; a batch from the source at the job's batch and a quarter of it."""
    from runner.data.layout import job_data
    from runner.data.pipeline import source
    from runner.plan import dense_facts

    rows = samples_per_step(cfg.train)
    say("dense part", 0, 3, force=True)
    repeats = repeats_for(cfg.calibrate)
    # also at the tiny-table job's batches (its overhead is what its step takes beyond these): a batch that large
    steps = step_batches(cfg.train.batch_size, cfg.calibrate.grid)
    data = next(iter(source(replace(job_data(cfg), rows=max(steps[-1], rows)), env.rank, env.world, False, 0, 1)))
    from runner.train.models import build_model

    dense = {r: dense_samples(build_model(cfg, device), cfg.precision.autocast, cfg.optimizer, data, r, device,
                              repeats) for r in sorted({max(rows // 4, 1), max(rows // 2, 1), rows, *steps})}
    facts = dense_facts(build_model(cfg, torch.device("meta")), rows)
    params = facts.params
    widths = LINEAR_WIDTHS[:2] if cfg.calibrate.grid == "small" else LINEAR_WIDTHS
    linear = {w: {r: linear_samples(w, r, device, repeats) for r in (max(rows // 4, 1), rows)}
              for w in widths}
    say("dense optimizer", 1, 3, force=True)
    # up to 16 M parameters: data-parallel tables are the dense optimizer's too, and past the caches its rate per
    # parameter is memory's, not the small dense part's
    sizes = (params, 16 * params) if cfg.calibrate.grid == "small" else (params, 16 * params, 1 << 22, 1 << 24)
    optimizer = {n: optimizer_samples(cfg.optimizer, n, device, repeats) for n in sorted(set(sizes))}
    say("input", 2, 3, force=True)
    quarter = cast("RunnerConfig", OmegaConf.merge(cfg, {"train": {"batch_size": max(cfg.train.batch_size // 4, 1)},
                                                         "data": {"prefetch_batches": 0}}))
    n = cfg.calibrate.repeats
    inputs = {r: input_samples(iter(source(job_data(c), env.rank, env.world, False, 0, n + 1)), n)
              for r, c in ((rows, cfg), (samples_per_step(quarter.train), quarter))}
    from runner.config.tables import table_specs

    job = {"batch": rows, "world": env.world, "device": device.type, "pooling": int(cfg.data.ids_per_feature),
           "layers": facts.layers, "other_params": facts.other_params,
           "dims": tuple(int(t.embedding_dim) for t in table_specs(cfg.model))}  # a tuple: one value, not per rank
    return {"dense": dense, "optimizer": optimizer, "input": inputs, "params": params, "job": job, "linear": linear}


def _by_rank(mine: Dict[str, Any], world: int) -> Dict[str, Any]:
    """Every rank's measurements, gathered: each sample list becomes a list of per-rank sample lists."""
    everyone: List[Any] = [None] * world
    dist.all_gather_object(everyone, mine)

    def merge(values: List[Any]) -> Any:
        if isinstance(values[0], dict):
            keys = [k for k in values[0] if all(k in v for v in values)]
            return {k: merge([v[k] for v in values]) for k in keys}
        if isinstance(values[0], list) and values[0] and isinstance(values[0][0], dict):
            return [merge([v[i] for v in values]) for i in range(len(values[0]))]
        if isinstance(values[0], list):
            return values
        return values[0]
    return merge(everyone)


def run_calibration(cfg: RunnerConfig, run_dir: Path, env: RankEnv, device: torch.device, reporter: Reporter,
                    *_: object) -> Dict[str, Any]:
    """A calibration job's rank (its mode's ``works``; the trainer's marks, cores and host allocation unused):
    every rank measures (collectives, kernels, sharded lookups, the dense part, the job's step with tiny tables),
    the measurements gathered on every rank; rank 0 fits, writes and logs the calibration and returns the
    results."""
    from runner.plan import calibrate_results
    from runner.runtime.hardware import fingerprint

    started = time.perf_counter()
    say = _Progress(reporter.active)
    c = cfg.calibrate
    mine: Dict[str, Any] = {"collectives": _collectives(c, env, device, say)}
    mine["kernels"] = _kernels(c, cfg.optimizer, device, say)
    if device.type == "cuda":  # (an empty list would gather as every rank's empty list)
        mine["uvm_kernels"] = _kernels(c, cfg.optimizer, device, say, uvm=True)
    mine["sharded"] = _sharded(cfg.train.batch_size, cfg.optimizer, cfg.precision, repeats_for(c), env, device, say)
    mine.update(_dense(cfg, env, device, say))
    say("the job's step with tiny tables", 0, 1, force=True)
    rows = step_batches(cfg.train.batch_size, cfg.calibrate.grid)
    steps = STEP_STEPS // 2 if cfg.calibrate.grid == "small" else STEP_STEPS
    mine["step"] = {r: step_samples(cfg, r, env.rank, env.world, env.local_world, device, steps) for r in rows}
    # a scope's group holds only some ranks: its samples are merged over the ranks that measured them
    gathered = _by_rank(mine, env.world)
    for name, by_scope in gathered["collectives"].items():
        for scope, by_size in by_scope.items():
            gathered["collectives"][name][scope] = {n: [s for s in per_rank if s] for n, per_rank in by_size.items()}
    if not reporter.active:
        return {}
    return calibrate_results(c, cfg.cluster.calibration_dir, run_dir, gathered, fingerprint(
        device.type, env.world // env.local_world, env.local_world, device), time.perf_counter() - started, reporter)
