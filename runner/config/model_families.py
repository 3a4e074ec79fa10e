"""Every model family ``model.family`` may name, each declared once, here.

A declaration says how the family is built (a function of :mod:`runner.train.models`, found by name when a rank
builds its model: ``(model, tables, dense_in, dense_device) -> module``, the module returning ``(loss, (loss,
logits, labels))``) and the rules the config check applies to it. The schema's allowed values, the config check,
the tables' widths and the model's builder read it; nothing else names a family. Adding one is its builder, its
declaration below, its conf file (``conf/model/``) and its test (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict


@dataclass(frozen=True)
class ModelFamily:
    name: str
    summary: str
    """What it is, in a few words (``--help``, docs)."""
    builds: str
    """``module:function`` building the model with its loss."""
    one_width: bool = True
    """Every table has ``model.embedding_dim`` (an interaction that needs one width); False: tables of any width,
    generated tables taking ``model.generated_tables.dims`` in turn."""
    dense_out_is_dim: bool = False
    """The dense MLP's last layer must be ``model.embedding_dim`` (it joins the embeddings' interaction)."""
    multi_task: bool = False
    """It predicts several labels (``model.tasks``); else exactly one."""


_TRAIN = "runner.train.models:"
FAMILIES: Dict[str, ModelFamily] = {f.name: f for f in (
    ModelFamily("dlrm", "TorchRec's DLRM (dot interaction)", _TRAIN + "build_dlrm", dense_out_is_dim=True),
    ModelFamily("dcn", "TorchRec's DLRM with a DCN-v2 cross network", _TRAIN + "build_dcn", dense_out_is_dim=True),
    ModelFamily("deepfm", "TorchRec's DeepFM", _TRAIN + "build_deepfm"),
    ModelFamily("dnn", "pooled embeddings of any widths concatenated with the dense MLP's output, then the over "
                "MLP", _TRAIN + "build_dnn", one_width=False),
    ModelFamily("mmoe", "multi-gate mixture of experts over the pooled embeddings, one tower per task",
                _TRAIN + "build_mmoe", multi_task=True),
)}
