"""The GPU-host decisions that can be checked without a GPU: which GPUs each emulated node gets, workers
against visible GPUs, the planner's HBM cap, bf16, Slurm's GPU and CPU request, autocast around the
forward only. No test here pretends to have run CUDA."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from runner.config.errors import ConfigError
from runner.config.precisions import in_hardware
from runner.launch.schedulers.slurm import job_shape, parse_node_resources
from runner.runtime.device import (
    GIB,
    check_autocast,
    check_autocast_before_launch,
    check_gpu_count,
    check_start_method,
    cuda_decision,
    hbm_cap_bytes,
    job_gpus,
    node_gpus,
    visible_gpus,
)
from runner.train.models import autocast_forward


def test_emulated_nodes_get_disjoint_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    host = visible_gpus(count=8)
    assert [node_gpus(host, n, 2) for n in range(2)] == ["0,1", "2,3"]
    assert [node_gpus(host, n, 4) for n in range(2)] == ["0,1,2,3", "4,5,6,7"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,GPU-aa,GPU-bb,-1,7")  # CUDA stops at the invalid entry
    host = visible_gpus()
    assert host == ["4", "5", "GPU-aa", "GPU-bb"]
    assert [node_gpus(host, n, 2) for n in range(2)] == ["4,5", "GPU-aa,GPU-bb"]


def test_workers_are_checked_against_visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    with pytest.raises(ConfigError) as e:
        check_gpu_count(8, 8, visible_gpus())  # gpu_1x8 on a 4-GPU host
    msg = str(e.value)
    assert "cluster.workers_per_node=8" in msg and "at most 4" in msg and "CUDA_VISIBLE_DEVICES=0,1,2,3" in msg
    with pytest.raises(ConfigError, match="at most 2"):
        check_gpu_count(6, 3, visible_gpus())  # 2 emulated nodes x 3 workers on 4 GPUs
    note = check_gpu_count(2, 2, visible_gpus())  # cluster=local on 4 GPUs: runs, and says so
    assert note is not None and "2 of this host's 4 GPUs" in note
    assert check_gpu_count(4, 2, visible_gpus()) is None


def test_hbm_cap_is_the_smallest_gpu_unless_set_below_it() -> None:
    h100 = 85_031_714_816  # what torch reports for an "80 GB" H100: 79.19 GiB
    assert hbm_cap_bytes(None, h100) == h100
    assert hbm_cap_bytes(79.0, h100) == int(79.0 * GIB)
    with pytest.raises(ConfigError) as e:
        hbm_cap_bytes(80.0, h100)
    assert "cluster.hbm_cap_gib=80.0" in str(e.value) and "79.19" in str(e.value)


def test_bf16_is_refused_on_a_gpu_without_it() -> None:
    with pytest.raises(ConfigError, match="precision='bf16'.*Tesla V100"):
        check_autocast("bfloat16", (7, 0), "Tesla V100-SXM2-32GB")
    t4, a100 = ("Tesla T4", (7, 5), "GPU-11aa-t4"), ("NVIDIA A100", (8, 0), "GPU-22bb-a100")
    with pytest.raises(ConfigError, match="Tesla T4 has no bf16 in hardware"):  # before launch: torch would emulate
        check_autocast_before_launch("bfloat16", [t4, t4])
    mixed = [t4, a100, a100]  # a host with both: what matters is the GPUs the job's workers get
    for visible, count, refused in ((["0", "1"], 2, True), (["1", "2"], 2, False), (["1", "0"], 1, False),
                                    (["GPU-22bb-a100"], 1, False), (["GPU-11aa"], 1, True), (["22bb"], 1, False),
                                    (["0", "1", "2"], 2, True)):
        gpus = job_gpus(mixed, visible, count)
        assert len(gpus) == count, (visible, gpus)
        if refused:
            with pytest.raises(ConfigError, match="Tesla T4"):
                check_autocast_before_launch("bfloat16", gpus)
        else:
            check_autocast_before_launch("bfloat16", gpus)
    assert job_gpus(mixed, ["7", "GPU-none"], 2) == []  # no such GPU: CUDA refuses it at start-up
    check_autocast_before_launch("bfloat16", [])  # NVML not there: the workers check
    bf16 = [in_hardware("bfloat16", c) for c in ((9, 0), (8, 6), (8, 0), (7, 5), (6, 1))]
    assert bf16 == [True, True, True, False, False]
    assert in_hardware("float16", (6, 1)) and in_hardware(None, (3, 0))
    check_autocast("bfloat16", (9, 0), "NVIDIA H100")
    check_autocast("float16", (7, 0), "Tesla V100-SXM2-32GB")


def _point(device: str, workers: int = 8, nodes: int = 2, mode: str = "train") -> tuple:
    return mode, OmegaConf.create({"device": device, "workers_per_node": workers, "nodes": nodes})


def test_slurm_jobs_request_gpus_whenever_workers_use_cuda() -> None:
    assert parse_node_resources("64 gpu:8\n96 gpu:a100:8(S:0-1),tmpdisk:100\n") == (64, 8)
    assert parse_node_resources("2 (null)\n2 (null)\n") == (2, 0)
    gpu_nodes, cpu_nodes = (96, 8), (2, 0)
    assert job_shape(*_point("cuda"), {}, *gpu_nodes) == (2, 32, 8)  # 4 CPUs per GPU worker
    assert job_shape(*_point("auto"), {}, *gpu_nodes) == (2, 32, 8)  # auto on GPU nodes: CUDA workers
    assert job_shape(*_point("auto", 2), {}, *cpu_nodes) == (2, 2, None)  # auto on CPU nodes: none
    assert job_shape(*_point("cpu"), {}, *gpu_nodes) == (2, 8, None)
    assert job_shape(*_point("cuda", 8), {}, 16, 8) == (2, 16, 8)  # at most the node's CPUs
    assert job_shape(*_point("cuda"), {"cpus_per_task": 10, "gpus_per_node": 4}, *gpu_nodes) == (2, 10, 4)
    assert job_shape(*_point("cuda", mode="plan"), {}, *gpu_nodes) == (1, 1, None)


def test_autocast_wraps_the_forward_only() -> None:
    seen = []

    class Probe(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(torch.is_autocast_enabled("cpu"))
            if x.shape[0] == 0:
                raise ValueError("empty")
            return self.linear(x)

    model = Probe()
    autocast_forward(model, "cpu", "bfloat16")
    out = model(torch.ones(2, 4))
    assert seen == [True] and out.dtype == torch.bfloat16 and not torch.is_autocast_enabled("cpu")
    out.float().sum().backward()  # outside autocast; the gradient reaches the fp32 weights
    assert model.linear.weight.grad is not None and model.linear.weight.grad.dtype == torch.float32
    with pytest.raises(ValueError):
        model(torch.ones(0, 4))
    assert not torch.is_autocast_enabled("cpu")  # left on a failed forward too
    plain = Probe()
    autocast_forward(plain, "cpu", None)
    assert plain(torch.ones(2, 4)).dtype == torch.float32


def test_cuda_is_decided_without_initialising_it_and_a_cpu_torch_on_a_gpu_host_is_said() -> None:
    assert cuda_decision(0, 0, None, "2.13.0+cpu") == (False, "")  # no NVIDIA driver: CPU, nothing to say
    assert cuda_decision(8, 8, "12.8", "2.13.0") == (True, "")
    present, note = cuda_decision(8, 0, None, "2.13.0+cpu")  # GPUs, but a CPU build of torch
    assert not present and "lists 8 GPU(s) but torch 2.13.0+cpu is a CPU build" in note and "runs on CPU" in note
    assert cuda_decision(1, 0, "12.8", "2.13.0") == (False, "")  # CUDA_VISIBLE_DEVICES="" hides them on purpose
    # torch built for CUDA 13.0 (PyPI's 2.13.0): a 13.x driver runs it (minor-version compatibility), 12.x not
    assert cuda_decision(1, 1, "13.0", "2.13.0", driver_cuda=13000) == (True, "")
    assert cuda_decision(1, 1, "12.6", "2.13.0+cu126", driver_cuda=12040) == (True, "")
    assert cuda_decision(1, 1, "12.8", "2.13.0+cu128", driver_cuda=13020) == (True, "")
    present, note = cuda_decision(2, 2, "13.0", "2.13.0", driver_cuda=12040)
    assert not present and "driver runs CUDA 12.4 but torch 2.13.0 is built for CUDA 13.0" in note
    assert "CUDA 12.x build" in note and "runs on CPU" in note
    import torch.cuda

    assert not torch.cuda.is_initialized()  # the suite's own questions initialised nothing


def test_cuda_workers_are_never_forked() -> None:
    with pytest.raises(ConfigError, match="cluster.start_method='fork'.*auto or spawn with CUDA"):
        check_start_method("fork", "cuda")
    for method, kind in (("fork", "cpu"), ("spawn", "cuda"), ("auto", "cuda")):
        check_start_method(method, kind)


def test_parallel_cuda_jobs_get_disjoint_gpus_or_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A joblib sweep's jobs running at once on one host split its visible GPUs as they split its cores
    (indices or UUIDs alike), or are refused in one line when there are too few."""
    import os
    import subprocess
    import sys

    from runner.runtime.cores import gpu_share, job_cores

    uuids = [f"GPU-{i}aa" for i in range(8)]
    assert gpu_share(uuids, 1, 2, 4) == uuids[4:] and gpu_share(uuids, 0, 4, 2) == uuids[:2]
    with pytest.raises(ConfigError, match="n_jobs=3 is not allowed; expected at most 2 CUDA jobs at once.*8 are"):
        gpu_share(uuids, 0, 3, 4)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two jobs at once need two cores here")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    other = ("import os; from runner.runtime.cores import job_cores\n"
             "with job_cores(2, gpus=4) as cores: print(os.environ['CUDA_VISIBLE_DEVICES'], cores)")
    allowed, host = os.sched_getaffinity(0), dict(os.environ)
    with job_cores(2, gpus=4) as first:  # two jobs of 4 workers each, the second in another process
        seen = os.environ["CUDA_VISIBLE_DEVICES"]
        out = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, check=True, env=host,
                             preexec_fn=lambda: os.sched_setaffinity(0, allowed)).stdout
        gpus, cores = out.split(" ", 1)
        assert {seen, gpus} == {"0,1,2,3", "4,5,6,7"} and str(first) != cores.strip()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"  # the host's view again after the jobs


def test_host_memory_per_gpu_is_reconciled_with_what_the_host_gives_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu_1x8's 256 GiB of DDR per GPU (UVM tables) on a host that gives the job less: planned at the share."""
    from runner.launch.schedulers import allocations
    from runner.runtime.cores import job_memory
    from runner.runtime.device import ddr_cap_for_host

    assert ddr_cap_for_host(256.0, 8, 4096 * GIB, "the host's memory") == (256.0, "")  # a 4 TiB host
    cap, note = ddr_cap_for_host(256.0, 8, 1024 * GIB, "the cgroup's memory.max")
    assert cap == 128.0 and "cluster.ddr_cap_gib=256.0" in note and "the cgroup's memory.max" in note
    assert ddr_cap_for_host(None, 8, 64 * GIB, "x") == (None, "")  # not set: TorchRec's default stands
    host, source = job_memory()  # this machine, read for real
    assert host and host > 2**30 and source
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "1024")  # a 1 GiB Slurm allocation bounds it
    assert job_memory(allocations()) == (2**30, "Slurm's allocation (SLURM_MEM_PER_NODE)")
    monkeypatch.setenv("SLURM_MEM_PER_NODE", str(2**30))  # 1 PiB: the host's memory bounds it
    assert job_memory(allocations()) == (host, source)
