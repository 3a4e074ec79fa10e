"""The sharders DistributedModelParallel is given: which sharding types are offered, and quantised comms."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

from torch import nn
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ModuleSharder

from runner.config.precisions import COMM_DTYPES

if TYPE_CHECKING:
    from runner.config.schema import PrecisionSchema


class EmbeddingBagCollectionAnyDeviceSharder(EmbeddingBagCollectionSharder):
    """TorchRec's EBC sharder, offering the CUDA sharding types on CPU too.

    The stock sharder offers only data_parallel/table_wise/column_wise/table_column_wise when the
    compute device is CPU, although FBGEMM's CPU fused kernel runs row_wise, table_row_wise and
    grid_shard over gloo as well; without this, ``sharding=rowwise`` could not be honoured on CPU.
    """

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return super().sharding_types("cuda" if compute_device_type == "cpu" else compute_device_type)


def qcomm_registry(precision: PrecisionSchema) -> Optional[Dict[str, Any]]:
    """Codecs that quantise the sharded embeddings' collectives (``precision.qcomm_*``), or None."""
    if precision.qcomm_forward is None and precision.qcomm_backward is None:
        return None
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry

    def kind(name: Optional[str]) -> CommType:
        return CommType.FP32 if name is None else CommType[COMM_DTYPES[name].member]

    return get_qcomm_codecs_registry(QCommsConfig(forward_precision=kind(precision.qcomm_forward),
                                                  backward_precision=kind(precision.qcomm_backward)))


def sharders_for(precision: PrecisionSchema) -> List[ModuleSharder[nn.Module]]:
    """The sharders of a job: every embedding-bag collection, quantised comms as ``precision`` asks."""
    return [EmbeddingBagCollectionAnyDeviceSharder(qcomm_codecs_registry=qcomm_registry(precision))]
