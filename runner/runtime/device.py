"""Which device and backend a job uses, decided in one place for the driver, agents, planning and workers.

``cluster.device=auto`` means CUDA + NCCL when CUDA is present, else CPU + gloo; ``cuda`` on a machine
without CUDA is refused for training (planning for a GPU cluster works anywhere). torch is imported
only when a question needs it: asking whether CUDA is present goes to the driver (NVML) and initialises no
CUDA (:func:`cuda_present`). CUDA workers are spawned, never forked (:func:`check_start_method`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from runner.config.errors import ConfigError
from runner.config.optimizer_kinds import SPARSE_CPU_NAMES as SPARSE_OPTIMIZERS_CPU
from runner.config.precisions import AUTOCASTS, in_hardware

GIB = 1024**3


@contextlib.contextmanager
def _nvml() -> Iterator[Any]:
    """NVIDIA's management library, initialised; None where the driver cannot be asked (a machine without
    it has no CUDA: no need to import torch). Creates no CUDA context."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no library
        yield None
        return
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


_SAID: List[str] = []  # notes said once per process


def cuda_present() -> bool:
    """Whether this process can train on CUDA (:func:`cuda_verdict`); GPUs that torch cannot use (a CPU build
    of torch, or a CUDA build newer than the driver runs) are said once: the job runs on CPU."""
    present, note = cuda_verdict()
    if note and note not in _SAID:
        _SAID.append(note)
        print(note, flush=True)
    return present


def cuda_verdict() -> Tuple[bool, str]:
    """Whether this process can train on CUDA, and the note saying why not where GPUs are listed ('' else),
    asked without initialising CUDA: NVML lists the GPUs and the CUDA version its driver runs, then
    ``torch.cuda.device_count()`` (which counts through NVML before CUDA is initialised). torch's
    ``is_available()`` would call ``cuInit`` unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, and a process that
    forks its workers afterwards (an agent with ``cluster.start_method=fork``) would hand them a CUDA they
    cannot use."""
    with _nvml() as nvml:
        listed, driver = _listed(nvml), driver_cuda_version(nvml)
    if not listed:
        return False, ""
    import torch

    return cuda_decision(listed, torch.cuda.device_count(), torch.version.cuda, torch.__version__, driver)


def cuda_decision(listed: int, torch_count: int, torch_cuda: Optional[str], torch_version: str,
                  driver_cuda: Optional[int] = None) -> Tuple[bool, str]:
    """Whether to train on CUDA, from the GPUs the driver lists, the CUDA version it runs (NVML's integer,
    12040 for 12.4; None where unknown) and what torch counts and was built for; the note to say when GPUs
    are there but torch cannot use them ('' otherwise). A driver runs the CUDA builds of its own major
    version and older ones (CUDA's minor-version compatibility), not a newer major."""
    if listed and torch_cuda is not None and driver_cuda and driver_cuda // 1000 < int(torch_cuda.split(".")[0]):
        return False, (f"[runner] note: the NVIDIA driver runs CUDA {cuda_text(driver_cuda)} but torch {torch_version} "
                       f"is built for CUDA {torch_cuda}: cluster.device=auto runs on CPU (update the driver, or build "
                       f"the environment from PyTorch's index for a CUDA {driver_cuda // 1000}.x build: make gpu-env "
                       "TORCH_INDEX=..., docs/gpu.md)")
    if listed == 0 or torch_count > 0 or torch_cuda is not None:  # a CUDA torch seeing none: hidden on purpose
        return torch_count > 0, ""                                  # (CUDA_VISIBLE_DEVICES="")
    return False, (f"[runner] note: the NVIDIA driver lists {listed} GPU(s) but torch {torch_version} is a CPU "
                   "build: cluster.device=auto runs on CPU (install the CUDA builds of torch and FBGEMM: make "
                   "gpu-check)")


def _listed(nvml: Any) -> int:
    """GPUs the NVIDIA driver lists (0 where it cannot be asked)."""
    try:
        return int(nvml.nvmlDeviceGetCount()) if nvml is not None else 0
    except Exception:  # noqa: BLE001
        return 0


def driver_cuda_version(nvml: Any) -> Optional[int]:
    """The CUDA version the NVIDIA driver runs (12040 for 12.4), None where it cannot be asked (``nvml``: NVML,
    initialised, or None)."""
    try:
        return int(nvml.nvmlSystemGetCudaDriverVersion_v2()) if nvml is not None else None
    except Exception:  # noqa: BLE001
        return None


def cuda_text(version: int) -> str:
    """NVML's CUDA version integer as people write it: 12040 -> 12.4."""
    return f"{version // 1000}.{version % 1000 // 10}"


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


def check_start_method(start_method: str, device_kind: str) -> None:
    """Forked workers cannot use CUDA (their parent's CUDA state does not survive a fork): CUDA workers are
    spawned (``auto``), as TorchRec's examples start them."""
    if start_method == "fork" and device_kind == "cuda":
        raise ConfigError("cluster.start_method", start_method,
                          "auto or spawn with CUDA workers (a forked process cannot use CUDA; auto spawns them)")


def check_tf32(enabled: bool, device_kind: str) -> None:
    """TF32 is a CUDA matmul mode; asking for it on CPU is a config error, not a silent no-op."""
    if enabled and device_kind != "cuda":
        raise ConfigError("precision.tf32", enabled, "false on CPU workers (TF32 is a CUDA matmul mode)")


def check_sparse_optimizer(sparse: str, device_kind: str) -> None:
    """FBGEMM's CPU build runs only the exact SGD/Adagrad/row-wise Adagrad kernels."""
    if device_kind == "cpu" and sparse not in SPARSE_OPTIMIZERS_CPU:
        raise ConfigError("optimizer.sparse", sparse,
                          f"one of {', '.join(SPARSE_OPTIMIZERS_CPU)} on CPU ({sparse} needs a GPU)")


def check_pipeline(pipeline: str, device_kind: str) -> None:
    """A training pipeline whose overlap needs CUDA (:func:`runner.config.pipelines.device_fault`) is refused on
    CPU workers before anything trains."""
    from runner.config.pipelines import device_fault

    allowed = device_fault(pipeline, device_kind)
    if allowed is not None:
        raise ConfigError("train.pipeline", pipeline, allowed)


def visible_gpus(count: Optional[int] = None) -> List[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (indices or UUIDs); without
    that variable, ``0 .. count-1`` (``count``: torch's device count, read through NVML when it can, so
    that no CUDA context is created)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:  # CUDA stops at the first invalid entry
        names = (n.strip() for n in listed.split(","))
        return list(itertools.takewhile(lambda name: bool(name) and not name.startswith("-"), names))
    if count is None:
        import torch

        count = torch.cuda.device_count()
    return [str(i) for i in range(count)]


def node_gpus(visible: Sequence[str], node_slot: int, workers_per_node: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the ``node_slot``-th node emulated on this host: its own
    ``workers_per_node`` GPUs, so that each node's LOCAL_RANK k is its own ``cuda:k``, where TorchRec
    places shards (``rank % local_world_size``)."""
    first = node_slot * workers_per_node
    return ",".join(visible[first:first + workers_per_node])


def check_gpu_count(workers_on_host: int, workers_per_node: int, visible: Sequence[str]) -> Optional[str]:
    """Refuse more CUDA workers on this host than it has visible GPUs (one each); the note to print when
    the job leaves GPUs unused (None: every GPU is used)."""
    if workers_on_host > len(visible):
        emulated = workers_on_host // workers_per_node
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        seen = f"{len(visible)} visible" + (f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else "")
        raise ConfigError("cluster.workers_per_node", workers_per_node,
                          f"at most {len(visible) // max(emulated, 1)} on this host: {workers_on_host} CUDA workers "
                          f"({emulated} node(s) x {workers_per_node}) need one GPU each and {seen}")
    if workers_on_host < len(visible):
        return (f"[runner] note: {workers_on_host} of this host's {len(visible)} GPUs are used "
                f"(cluster.workers_per_node={workers_per_node}; set it to {len(visible)} or pick cluster=gpu_1x8 "
                "to use them all)")
    return None


def host_gpus() -> List[Tuple[str, Tuple[int, int], str]]:
    """Every GPU the NVIDIA driver lists on this host: (name, compute capability, UUID), in NVML's order,
    read through NVML (no CUDA context, no torch); empty where NVML cannot be asked."""
    with _nvml() as nvml:
        if nvml is None:
            return []
        try:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            return [(str(nvml.nvmlDeviceGetName(h)), tuple(nvml.nvmlDeviceGetCudaComputeCapability(h)),
                     str(nvml.nvmlDeviceGetUUID(h))) for h in handles]
        except Exception:  # noqa: BLE001
            return []


def job_gpus(gpus: Sequence[Tuple[str, Tuple[int, int], str]], visible: Sequence[str],
             count: int) -> List[Tuple[str, Tuple[int, int], str]]:
    """The host GPUs (:func:`host_gpus`) that this host's ``count`` workers use: the first ``count`` of
    ``visible`` (:func:`visible_gpus`: indices, or UUIDs and their unique prefixes as CUDA takes them). An
    index counts in NVML's order, CUDA's own under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (each worker checks its
    GPU again through CUDA); a name that matches no GPU is left out."""
    found = []
    for name in visible[:count]:
        if name.isdigit():
            found += [gpus[int(name)]] if int(name) < len(gpus) else []
        else:
            found += [g for g in gpus if g[2].startswith(name) or g[2].startswith(f"GPU-{name}")][:1]
    return found


def check_autocast_before_launch(autocast: Optional[str], gpus: Sequence[Tuple[str, Tuple[int, int], str]]) -> None:
    """An autocast dtype refused before anything starts when one of the job's GPUs (:func:`job_gpus`) would
    emulate it (bf16 below Ampere); each worker checks its own GPU again (also under a plain torchrun, without a
    driver)."""
    for name, capability, _ in gpus:
        check_autocast(autocast, capability, name)


def check_autocast(autocast: Optional[str], capability: Tuple[int, int], device_name: str) -> None:
    """``precision.autocast`` needs a GPU that computes in it (:data:`runner.config.precisions.AUTOCASTS`)."""
    if not in_hardware(autocast, capability):
        kind = AUTOCASTS[str(autocast)]
        needs = ".".join(map(str, kind.hardware_from or ()))
        others = " or ".join(["fp32", *(a.short for a in AUTOCASTS.values() if in_hardware(a.name, capability))])
        raise ConfigError("precision", kind.short, f"{others} on this GPU ({device_name} has no {kind.short} in "
                          f"hardware: compute capability below {needs}, where torch would emulate it)")


def hbm_cap_bytes(configured_gib: Optional[float], smallest_device_bytes: int) -> int:
    """The planner's HBM per GPU: ``cluster.hbm_cap_gib`` when set (refused above the memory free on the
    job's GPU with the least), else that GPU's free memory (another process's share of a GPU is not the
    job's to plan for)."""
    if configured_gib is None:
        return int(smallest_device_bytes)
    if configured_gib * GIB > smallest_device_bytes:
        raise ConfigError("cluster.hbm_cap_gib", configured_gib,
                          f"at most {smallest_device_bytes / GIB:.2f} (the job's GPU with the least free memory "
                          f"has {smallest_device_bytes / GIB:.2f} GiB free), or null to read it from the devices")
    return int(configured_gib * GIB)


def ddr_cap_for_host(configured_gib: Optional[float], workers_on_host: int, job_bytes: Optional[int],
                     bound_by: str) -> Tuple[Optional[float], str]:
    """``cluster.ddr_cap_gib`` (host memory per GPU, where UVM tables live) reconciled with what this host
    gives the job: a value above its share per worker (``job_bytes`` over ``workers_on_host``) is planned at
    that share instead (GPU presets carry a DGX-class 256 GiB), with the note to say; unchanged otherwise."""
    if configured_gib is None or not job_bytes:
        return configured_gib, ""
    share = job_bytes / max(workers_on_host, 1) / GIB
    if configured_gib <= share:
        return configured_gib, ""
    return round(share, 2), (f"[runner] note: cluster.ddr_cap_gib={configured_gib} is more host memory per GPU than "
                             f"this host gives the job ({job_bytes / GIB:.1f} GiB, {bound_by}, over {workers_on_host} "
                             f"workers): planned with {share:.2f} GiB per GPU")
