"""Names whose module moved between the FBGEMM and TorchRec releases the runner supports
(``requirements/stacks.toml``), each behind one function that tries the newest path first.

Nothing outside this module imports a module path that exists in only some supported releases:
``tests/plan/test_torchrec_seam.py`` scans runner/ for the paths listed in :data:`VERSIONED`, and ``make
compat`` imports every FBGEMM and TorchRec module the runner names on every supported stack. Like
:mod:`.torchrec_seam`, this module imports nothing at module level, so it may be imported anywhere.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Dict, Tuple

# name -> its modules, newest first (FBGEMM 1.8 moved the TBE configs into fbgemm_gpu.tbe.*; 1.6 and 1.7 keep
# them where 1.8 and 1.9 still re-export them, in the ops modules, whose import costs more)
PLACES: Dict[str, Tuple[str, ...]] = {
    "CacheAlgorithm": ("fbgemm_gpu.tbe.cache.cache_config", "fbgemm_gpu.split_table_batched_embeddings_ops_common"),
    "MultiPassPrefetchConfig": ("fbgemm_gpu.tbe.cache.cache_config",
                                "fbgemm_gpu.split_table_batched_embeddings_ops_common"),
    "WeightDecayMode": ("fbgemm_gpu.tbe.config.optimizer_config",
                        "fbgemm_gpu.split_table_batched_embeddings_ops_training"),
    "EmbeddingLocation": ("fbgemm_gpu.tbe.config.embedding_config",
                          "fbgemm_gpu.split_table_batched_embeddings_ops_common"),
    "ComputeDevice": ("fbgemm_gpu.tbe.config.embedding_config", "fbgemm_gpu.split_table_batched_embeddings_ops_common"),
    "SplitTableBatchedEmbeddingBagsCodegen": ("fbgemm_gpu.split_table_batched_embeddings_ops_training",),
}
VERSIONED = ("fbgemm_gpu.tbe.cache.cache_config", "fbgemm_gpu.tbe.config.optimizer_config",
             "fbgemm_gpu.tbe.config.embedding_config", "fbgemm_gpu.tbe.cache.uvm")
"""Module paths that exist in only some supported releases (found by ``make compat``'s import check)."""


@functools.lru_cache(maxsize=None)
def _find(name: str) -> Any:
    tried = []
    for module in PLACES[name]:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            tried.append(f"{module} ({type(exc).__name__})")
    raise ImportError(f"{name} is in none of the modules the supported FBGEMM releases keep it in: " + ", ".join(tried))


def cache_algorithm() -> Any:
    """FBGEMM's ``CacheAlgorithm`` enum (a UVM-caching table's eviction policy)."""
    return _find("CacheAlgorithm")


def multipass_prefetch_config() -> Any:
    """FBGEMM's ``MultiPassPrefetchConfig``."""
    return _find("MultiPassPrefetchConfig")


def weight_decay_mode() -> Any:
    """FBGEMM's ``WeightDecayMode`` enum (the fused optimizers' weight decay)."""
    return _find("WeightDecayMode")


def fused_tbe_class() -> Any:
    """FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen``: TorchRec's ``fused`` kernel (``mode=calibrate`` times it)."""
    return _find("SplitTableBatchedEmbeddingBagsCodegen")


def tbe_placement(on_gpu: bool, uvm_caching: bool = False) -> Tuple[Any, Any]:
    """FBGEMM's ``EmbeddingLocation`` and ``ComputeDevice`` of a table held on the GPU (``DEVICE``, ``CUDA``), in host
    memory with a GPU cache (``MANAGED_CACHING``: TorchRec's ``fused_uvm_caching``), or in host memory and computed
    there (``HOST``, ``CPU``)."""
    location, device = _find("EmbeddingLocation"), _find("ComputeDevice")
    if uvm_caching:
        return location.MANAGED_CACHING, device.CUDA
    return (location.DEVICE, device.CUDA) if on_gpu else (location.HOST, device.CPU)
