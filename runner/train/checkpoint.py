"""Checkpoints with torch.distributed.checkpoint: written atomically, found again, loaded into any sharding.

Layout: ``<checkpoints>/step-00000020/`` holds the DCP files of ``{"model", "optim"}``, ``meta.json``
(step, world, sharding types, eval metrics) and ``plan.json``. A checkpoint is written under a
``.tmp-`` name and renamed once complete, so an interrupted save is never picked up.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from runner.config.errors import CheckpointError
from runner.runtime import run_files

if TYPE_CHECKING:
    import torch
    from torchrec.optim.keyed import CombinedOptimizer

    from runner.config.schema import CheckpointSchema

STEP_DIR = re.compile(r"^step-(\d{8})$")
META = "meta.json"
BEST = "best.json"


def checkpoint_root(checkpoint_dir: Optional[str], run_folder: Path) -> Path:
    """Where a job's checkpoints go: ``train.checkpoint.dir`` (``checkpoint_dir``), else the run folder's."""
    return Path(checkpoint_dir).resolve() if checkpoint_dir else run_folder / run_files.CHECKPOINTS


def complete_checkpoints(root: Path) -> List[Path]:
    """Finished checkpoints under ``root``, oldest first (temporary folders are never listed)."""
    if not root.is_dir():
        return []
    numbered = [(int(m.group(1)), d) for d in root.iterdir()
                if d.is_dir() and (m := STEP_DIR.match(d.name)) is not None and (d / META).is_file()]
    return [d for _, d in sorted(numbered)]


def resolve(resume: Optional[str], root: Path) -> Optional[Path]:
    """The checkpoint ``train.resume`` names, or :class:`CheckpointError` saying what is wrong."""
    if resume is None:
        return None
    where = f"train.resume={resume}"
    if resume == "latest":
        found = complete_checkpoints(root)
        if not found:
            raise CheckpointError(f"{where}: no complete checkpoint in {root}")
        return found[-1]
    path = Path(resume).expanduser().resolve()
    if not path.exists():
        raise CheckpointError(f"{where}: no such file or folder")
    if (path / META).is_file():
        if not (path / ".metadata").is_file():
            raise CheckpointError(f"{where}: incomplete checkpoint (no DCP .metadata file)")
        return path
    found = complete_checkpoints(path)
    if found:
        return found[-1]
    raise CheckpointError(f"{where}: not a checkpoint (no {META}) and holds no step-* checkpoint")


def _read_best(path: Path) -> Optional[Dict[str, Any]]:
    """The best checkpoint's record; None where there is none, or where it cannot be read back (said: the next
    checkpoint with the metric becomes the best, and none is kept as best meanwhile)."""
    if not path.exists():
        return None
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        found = None
    if isinstance(found, dict) and isinstance(found.get("path"), str) and isinstance(found.get("value"), (int, float)):
        return found
    print(f"[runner] warning: {path} cannot be read back; the next checkpoint with the metric becomes the best",
          flush=True)
    return None


def read_meta(path: Path) -> Dict[str, Any]:
    """A checkpoint's metadata, or :class:`CheckpointError` in one line naming it and what to do; what a resume takes
    from it is checked value by value (the start step a count, the fp16 loss scaler's state one it can hold)."""
    from runner.train.split_step import LossScale

    try:
        found = json.loads((path / META).read_text())
        step, scale = (found.get("step"), found.get("loss_scale")) if isinstance(found, dict) else (None, None)
        why = ("not a metadata record" if not isinstance(found, dict) else f"step={step!r} is not a step count" if not
               (type(step) is int and 0 <= step < 2**62) else None if scale is None else LossScale.state_fault(scale))
    except (OSError, ValueError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    if why is None:
        return found
    raise CheckpointError(f"checkpoint {path}: its {META} cannot be read back ({why}); resume from another "
                          "checkpoint (train.resume=<its folder>) or without train.resume")


def _state(dmp: torch.nn.Module, optimizer: CombinedOptimizer, with_optimizer: bool) -> Dict[str, Any]:
    state = {"model": dmp.state_dict()}
    if with_optimizer:
        state["optim"] = optimizer.state_dict()
    return state


def _failure_detail(exc: BaseException) -> str:
    """The first line of the underlying error (DCP wraps each rank's failure)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        exc = inner[0] if isinstance(inner, tuple) else inner
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _materialise_dense_state(optimizer: CombinedOptimizer) -> None:
    """torch optimizers create state at their first step; DCP loads only into state that exists."""
    from torchrec.optim.keyed import KeyedOptimizerWrapper

    for _, opt in optimizer.optimizers:
        if isinstance(opt, KeyedOptimizerWrapper):
            opt.init_state()
            opt.zero_grad(set_to_none=True)


def load(path: Path, dmp: torch.nn.Module, optimizer: CombinedOptimizer, resume_optimizer: bool,
         rank: int) -> Dict[str, Any]:
    """Load ``path`` into this job's sharding (resharding as needed); return its meta."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint.api import CheckpointException

    meta = read_meta(path)
    if resume_optimizer:
        _materialise_dense_state(optimizer)
    state = _state(dmp, optimizer, resume_optimizer)
    try:
        dcp.load(state, checkpoint_id=str(path), planner=DefaultLoadPlanner(allow_partial_load=not resume_optimizer))
    except (Exception, CheckpointException) as exc:  # DCP's CheckpointException is a BaseException
        detail = _failure_detail(exc)
        if resume_optimizer and "optim" in detail:
            raise CheckpointError(
                f"checkpoint {path}: its optimizer state does not fit this sharding ({detail}); set "
                "train.resume_optimizer=false to load the weights and start optimizer state fresh") from None
        said = table_mismatch(detail) or f"cannot be loaded ({detail})"
        raise CheckpointError(f"checkpoint {path}: {said}") from None
    dmp.load_state_dict(state["model"])
    if resume_optimizer:
        optimizer.load_state_dict(state["optim"])
    elif rank == 0:
        print(f"[runner] warning: {path}: weights loaded, optimizer state starts fresh "
              "(train.resume_optimizer=false)", flush=True)
    return meta


_SIZES = re.compile(r"saved torch\.Size\(\[(\d+), (\d+)\]\) and current: torch\.Size\(\[(\d+), (\d+)\]\) "
                    r"for (\S*embedding_bags\.([^.\s]+)\.weight)")


def table_mismatch(detail: str) -> Optional[str]:
    """DCP's size mismatch of an embedding table's weight, said in the model's terms (which table, its rows and
    width in the checkpoint and in this model, what loads it); None for any other failure."""
    found = _SIZES.search(detail)
    if found is None:
        return None
    rows, dim, now_rows, now_dim, _, table = found.groups()
    what = (f"model.tables' {table}: num_embeddings={int(rows)}" if rows != now_rows else "")
    what += (" and " if what and dim != now_dim else "") + (f"embedding_dim={int(dim)}" if dim != now_dim else "")
    return (f"table {table} has {int(rows):,} rows x {dim} in the checkpoint but {int(now_rows):,} x {now_dim} in "
            f"this model; a checkpoint loads into the model it was saved from ({what}), resharded as needed: "
            "resume with that model, or train this one without train.resume")


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def state_bytes(state: Any, rank: int) -> int:
    """Bytes this rank writes for ``state``: its shards of sharded tensors, and whole plain tensors on rank
    0 only (DCP writes a replicated tensor once)."""
    import torch
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    total = 0
    stack = [state]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, ShardedTensor):
            total += sum(s.tensor.numel() * s.tensor.element_size() for s in item.local_shards())
        elif isinstance(item, DTensor):
            local = item.to_local()
            total += local.numel() * local.element_size()
        elif isinstance(item, torch.Tensor) and rank == 0:
            total += item.numel() * item.element_size()
    return total


def check_space(root: Path, my_bytes: int, step: int) -> int:
    """Refuse, on every rank and before writing, a checkpoint its disks cannot hold: each host checks the
    free space of its checkpoint folder against what its ranks will write. Returns this host's bytes."""
    import socket

    import torch.distributed as dist

    host = socket.gethostname()
    sizes: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, (host, my_bytes))
    needed = int(sum(b for h, b in sizes if h == host) * 1.05) + (1 << 20)  # + metadata and file overhead
    root.mkdir(parents=True, exist_ok=True)  # a host without rank 0 has not made it yet
    free = shutil.disk_usage(root).free
    verdict = None if needed <= free else (
        f"checkpoint at step {step}: {root} has {_mib(free)} free on {host}, the checkpoint needs about "
        f"{_mib(needed)}; nothing was written and earlier checkpoints are complete (train.resume=latest); free "
        "space, set train.checkpoint.dir to a larger disk, or lower train.checkpoint.keep_last")
    verdicts: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, verdict)
    refusal = next((v for v in verdicts if v), None)
    if refusal:
        if dist.get_rank() == 0:
            shutil.rmtree(root / f".tmp-step-{step:08d}", ignore_errors=True)
        raise CheckpointError(refusal)
    return needed


class Checkpointer:
    """Saves on every rank (DCP is collective); rank 0 finalises, prunes and tracks the best."""

    def __init__(self, settings: CheckpointSchema, run_folder: Path, rank: int) -> None:
        self.cfg = settings
        self.root = checkpoint_root(settings.dir, run_folder)
        self.rank = rank

    def due(self, step: int) -> bool:
        return bool(self.cfg.enabled and self.cfg.every_steps and step % self.cfg.every_steps == 0)

    def save(self, step: int, dmp: torch.nn.Module, optimizer: CombinedOptimizer, meta: Dict[str, Any],
             plan_file: Path) -> Path:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        tmp, final = self.root / f".tmp-step-{step:08d}", self.root / f"step-{step:08d}"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        state = _state(dmp, optimizer, True)
        needed = check_space(self.root, state_bytes(state, self.rank), step)
        try:
            dcp.save(state, checkpoint_id=str(tmp))
        except (Exception, CheckpointException) as exc:  # DCP's CheckpointException is a BaseException
            full = shutil.disk_usage(self.root).free < (4 << 20)  # torch's writer says "unexpected pos", not ENOSPC
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)  # never a partial checkpoint
            detail = _failure_detail(exc)
            if full or "No space left" in detail or "Errno 28" in detail:
                raise CheckpointError(
                    f"checkpoint at step {step}: the disk of {self.root} filled up while writing (about "
                    f"{_mib(needed)} needed, {_mib(shutil.disk_usage(self.root).free)} free now); the partial "
                    "checkpoint was removed and earlier ones are complete (train.resume=latest); free space or set "
                    "train.checkpoint.dir to a larger disk") from None
            raise CheckpointError(f"checkpoint at step {step} in {self.root}: cannot be written ({detail})") from None
        dist.barrier()
        if self.rank == 0:
            (tmp / META).write_text(json.dumps({"step": step, "time": time.time(), **meta}, indent=2))
            if plan_file.exists():
                shutil.copy(plan_file, tmp / "plan.json")
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)  # the only moment a checkpoint becomes visible
            self._update_best(final, meta)
            self._prune()
        dist.barrier()
        return final

    def _update_best(self, path: Path, meta: Dict[str, Any]) -> None:
        key = self.cfg.best_metric
        value = meta.get("metrics", {}).get(key) if key else None
        if value is None:
            return
        best_file = self.root / BEST
        best = _read_best(best_file)
        better = best is None or (value > best["value"] if self.cfg.best_mode == "max" else value < best["value"])
        if better or (best and best["path"] == str(path)):
            best_file.write_text(json.dumps({"path": str(path), "metric": key, "value": value}))

    def _prune(self) -> None:
        best = (_read_best(self.root / BEST) or {}).get("path")
        for old in complete_checkpoints(self.root)[: -self.cfg.keep_last]:
            if str(old) != best:
                shutil.rmtree(old, ignore_errors=True)
        for stale in self.root.glob(".tmp-step-*"):  # left by an interrupted save
            shutil.rmtree(stale, ignore_errors=True)
