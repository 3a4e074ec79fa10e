"""Which device and backend a job uses, decided in one place for the driver, agents, planning and workers.

``cluster.device=auto`` means CUDA + NCCL when CUDA is present, else CPU + gloo; ``cuda`` on a machine
without CUDA is refused for training (planning for a GPU cluster works anywhere). torch is imported
only when a question needs it: asking whether CUDA is present goes to the driver (NVML) and creates no
CUDA context, so agents may still fork workers afterwards.
"""

from __future__ import annotations

from runner.config.choices import SPARSE_OPTIMIZERS_CPU
from runner.config.errors import ConfigError


def cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


def device_type(cluster_device: str, planning: bool = False) -> str:
    """``cuda`` or ``cpu`` for ``cluster.device``. Training on CUDA needs CUDA here; planning for it
    (``planning=True``, ``mode=plan``) does not."""
    if cluster_device == "auto":
        return "cuda" if cuda_present() else "cpu"
    if cluster_device == "cuda" and not planning and not cuda_present():
        raise ConfigError("cluster.device", cluster_device,
                          "auto or cpu on a machine without CUDA (mode=plan plans for GPU clusters anywhere)")
    return cluster_device


def backend(device_kind: str) -> str:
    """The process-group backend for a device type."""
    return "nccl" if device_kind == "cuda" else "gloo"


def check_tf32(enabled: bool, device_kind: str) -> None:
    """TF32 is a CUDA matmul mode; asking for it on CPU is a config error, not a silent no-op."""
    if enabled and device_kind != "cuda":
        raise ConfigError("precision.tf32", enabled, "false on CPU workers (TF32 is a CUDA matmul mode)")


def check_sparse_optimizer(sparse: str, device_kind: str) -> None:
    """FBGEMM's CPU build runs only the exact SGD/Adagrad/row-wise Adagrad kernels."""
    if device_kind == "cpu" and sparse not in SPARSE_OPTIMIZERS_CPU:
        raise ConfigError("optimizer.sparse", sparse,
                          f"one of {', '.join(SPARSE_OPTIMIZERS_CPU)} on CPU ({sparse} needs a GPU)")
