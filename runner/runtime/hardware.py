"""What hardware and software a job runs on, as a fingerprint a calibration is matched by.

A calibration (:mod:`runner.plan.cost.calibration`) is only valid for the devices, collectives and library builds it
was measured on: the fingerprint names them. :func:`MATCHED` lists the keys that must be equal for a calibration
to be used; the world's shape (nodes, workers per node) is recorded beside them and matched where it matters.
"""

from __future__ import annotations

import contextlib
import os
import platform
from typing import TYPE_CHECKING, Any, Dict, Optional

from runner.runtime.allocator import host_allocator

if TYPE_CHECKING:
    import torch

# keys that must be equal: the device, what runs on it, the kernels' and collectives' builds, and whether a CPU
# worker's steps fault their buffers in (:mod:`.allocator`)
MATCHED = ("device_kind", "device_name", "torch", "fbgemm", "torchrec", "cuda", "host_allocator")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s first ``model name``), else the platform's processor."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def library_versions() -> Dict[str, Optional[str]]:
    """torch, FBGEMM, TorchRec and CUDA (None on a CPU build) as installed here."""
    import fbgemm_gpu
    import torch
    import torchrec

    def text(v: Any) -> Optional[str]:
        return None if v is None else str(v)  # torch's version is a str subclass that YAML does not write
    return {"torch": text(torch.__version__), "fbgemm": text(getattr(fbgemm_gpu, "__version__", None)),
            "torchrec": text(getattr(torchrec, "__version__", None)), "cuda": text(torch.version.cuda)}


def fingerprint(device_kind: str, nodes: int, workers_per_node: int,
                device: Optional[torch.device] = None) -> Dict[str, Any]:
    """This machine's fingerprint for a job of ``nodes`` x ``workers_per_node`` on ``device_kind``; ``device``: the
    worker's torch device (its GPU's name; no CUDA is touched without it)."""
    name, driver = cpu_model(), None
    if device_kind == "cuda" and device is not None:
        import torch

        name, driver = torch.cuda.get_device_name(device), nvidia_driver()
    return {"device_kind": device_kind, "device_name": name, **library_versions(), "driver": driver,
            "host_allocator": host_allocator(device_kind), "cpu": cpu_model(), "host_cores": os.cpu_count(),
            "nodes": int(nodes), "workers_per_node": int(workers_per_node)}


def nvidia_driver() -> Optional[str]:
    """The NVIDIA driver's version (NVML), recorded beside a GPU calibration; None where NVML cannot say."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML here
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def mismatch(theirs: Dict[str, Any], ours: Dict[str, Any], world_matters: bool) -> Optional[str]:
    """The first way a calibration's fingerprint ``theirs`` differs from ``ours`` that makes it unusable, as
    words (``device_name 'X' here, 'Y' in the calibration``); None when it can be used. ``world_matters``: the
    world's shape must match too (a job that runs here; a plan for another cluster takes any shape)."""
    keys = MATCHED + (("nodes", "workers_per_node") if world_matters else ())
    return next((f"{key} {ours.get(key)!r} here, {theirs.get(key)!r} in the calibration" for key in keys
                 if theirs.get(key) != ours.get(key)), None)


def build_note(torch_cuda: Optional[str], gpus: int, nvidia_mib: float) -> str:
    """What build of torch this environment has, for the line ``make`` ends its install with: ``CPU build``;
    ``CUDA build`` with the GPUs it sees; or, on a machine without a GPU, the CUDA build and what it costs
    (``nvidia_mib``: the NVIDIA libraries installed beside it) and how to get the CPU build instead."""
    if torch_cuda is None:
        return "CPU build"
    if gpus:
        return f"CUDA {torch_cuda} build, {gpus} GPU(s)"
    return (f"CUDA {torch_cuda} build on a CPU-only machine: {nvidia_mib / 1024:.1f} GiB of NVIDIA libraries it "
            "does not use (PyTorch's CPU index did not answer; TORCH_CPU_INDEX names another, or a wheel folder "
            "in pip's find-links holding the CPU build)")


def install_line() -> str:
    """``environment ready: torch ... | fbgemm ... | torchrec ... | hydra ... | mlflow ... | <build>``."""
    import glob
    import sys

    import hydra
    import mlflow
    import torch

    versions = library_versions()
    site = [p for p in sys.path if p.endswith("site-packages")]
    nvidia = sum(os.path.getsize(f) for s in site for f in glob.glob(f"{s}/nvidia/**/*.so*", recursive=True))
    gpus = torch.cuda.device_count() if torch.version.cuda else 0
    return (f"environment ready: torch {versions['torch']} | fbgemm {versions['fbgemm']} | torchrec "
            f"{versions['torchrec']} | hydra {hydra.__version__} | mlflow {mlflow.__version__} | "
            f"{build_note(torch.version.cuda, gpus, nvidia / 2**20)}")
