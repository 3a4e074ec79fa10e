"""Every optimizer and learning-rate schedule the ``optimizer`` group may name, each declared once, here.

- sparse (``optimizer.sparse``): TorchRec's optimizer class that DMP maps onto an FBGEMM fused optimizer, whether
  FBGEMM's CPU build runs it, whether it takes an epsilon;
- dense (``optimizer.dense``): torch's optimizer class, the arguments it takes, whether torch fuses it;
- schedules (``optimizer.*_schedule.name``): the function of :mod:`runner.train.optimizers` giving the factor of
  the base learning rate after warm-up.

The schema's allowed values, the CPU check and the optimizers' builders read these; nothing else names an
optimizer or a schedule. Adding one is its declaration below (and, for a schedule, its function), a conf file
where it makes a preset (``conf/optimizer/``) and its test (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple


@dataclass(frozen=True)
class SparseOptimizer:
    name: str
    torchrec_class: str
    """The class of ``torchrec.optim`` (DMP maps it onto FBGEMM's fused optimizer)."""
    cpu: bool = False
    """FBGEMM's CPU build runs it."""
    eps: bool = True
    """It takes ``optimizer.sparse_eps``."""


@dataclass(frozen=True)
class DenseOptimizer:
    name: str
    torch_class: str
    """The class of ``torch.optim``."""
    eps: bool = True
    """It takes ``optimizer.dense_eps``."""
    momentum: bool = False
    """It takes ``optimizer.dense_momentum``."""
    fused: bool = True
    """torch's class takes ``fused`` (given ``True`` when ``optimizer.dense_fused``); without it torch chooses."""


@dataclass(frozen=True)
class Schedule:
    name: str
    factor: str
    """``module:function``: ``(schedule, steps after warm-up, steps after warm-up in all) -> factor``."""


SPARSE: Dict[str, SparseOptimizer] = {o.name: o for o in (
    SparseOptimizer("rowwise_adagrad", "RowWiseAdagrad", cpu=True),
    SparseOptimizer("adagrad", "Adagrad", cpu=True),
    SparseOptimizer("sgd", "SGD", cpu=True, eps=False),
    SparseOptimizer("adam", "Adam"),
    SparseOptimizer("lamb", "LAMB"),
    SparseOptimizer("partial_rowwise_adam", "PartialRowWiseAdam"),
    SparseOptimizer("partial_rowwise_lamb", "PartialRowWiseLAMB"),
)}
DENSE: Dict[str, DenseOptimizer] = {o.name: o for o in (
    DenseOptimizer("adam", "Adam"),
    DenseOptimizer("adamw", "AdamW"),
    DenseOptimizer("adagrad", "Adagrad"),
    DenseOptimizer("sgd", "SGD", eps=False, momentum=True),
)}
_TRAIN = "runner.train.optimizers:"
SCHEDULES: Dict[str, Schedule] = {s.name: s for s in (
    Schedule("constant", _TRAIN + "constant_factor"),
    Schedule("exp_decay", _TRAIN + "exp_decay_factor"),
    Schedule("steps", _TRAIN + "steps_factor"),
    Schedule("cosine", _TRAIN + "cosine_factor"),
)}
SPARSE_CPU_NAMES: Tuple[str, ...] = tuple(n for n, o in SPARSE.items() if o.cpu)
