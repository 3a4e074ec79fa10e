"""What ``mode=calibrate``'s parts time, in this process (one gloo rank): the collectives as a step issues them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

import pytest
import torch
import torch.distributed as dist

from runner.train.calibrate import BACK_TO_BACK, collective_samples
from runner.train.timing import Repeats


@pytest.fixture()
def one_rank(tmp_path: Path) -> Any:
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield dist.group.WORLD
    if started:
        dist.destroy_process_group()


def test_the_embeddings_collectives_receive_into_a_new_tensor_each_call(one_rank: Any, monkeypatch: Any) -> None:
    # TorchRec's distributions allocate their outputs every step; a reused output (pages already touched) measured
    # the all-to-all at about twice its bandwidth in a step
    outputs: List[torch.Tensor] = []
    inputs: List[torch.Tensor] = []
    real_a2a, real_rs, real_ar = dist.all_to_all_single, dist.reduce_scatter_tensor, dist.all_reduce
    real_ag = dist.all_gather_into_tensor

    def a2a(out: torch.Tensor, data: torch.Tensor, **kw: Any) -> Any:
        outputs.append(out)
        return real_a2a(out, data, **kw)

    def rs(out: torch.Tensor, data: torch.Tensor, **kw: Any) -> Any:
        outputs.append(out)
        return real_rs(out, data, **kw)

    def ag(out: torch.Tensor, data: torch.Tensor, **kw: Any) -> Any:
        outputs.append(out)
        return real_ag(out, data, **kw)

    def ar(data: torch.Tensor, **kw: Any) -> Any:
        inputs.append(data)
        return real_ar(data, **kw)
    monkeypatch.setattr(dist, "all_to_all_single", a2a)
    monkeypatch.setattr(dist, "reduce_scatter_tensor", rs)
    monkeypatch.setattr(dist, "all_gather_into_tensor", ag)
    monkeypatch.setattr(dist, "all_reduce", ar)
    for name in ("all_to_all", "reduce_scatter", "all_gather"):
        outputs.clear()
        times = collective_samples(name, one_rank, 1, 4096, torch.device("cpu"), Repeats(3, 3))
        assert len(times) == 3 and all(t > 0 for t in times)
        assert len(outputs) == 4 * BACK_TO_BACK  # a warm-up and 3 repeats, each BACK_TO_BACK calls
        assert len({id(t) for t in outputs}) == len(outputs), name  # every call its own output
        assert outputs[0].numel() * 4 == 4096, name  # one rank: the bytes TorchRec's term counts, received
    collective_samples("all_reduce", one_rank, 1, 4096, torch.device("cpu"), Repeats(3, 3))
    assert len({id(t) for t in inputs}) == 1  # in place on one tensor, as DDP's buckets


def test_the_all_reduce_is_issued_as_ddp_issues_a_step_s_gradients(one_rank: Any, monkeypatch: Any) -> None:
    from runner.train.calibrate import DDP_BUCKET, ddp_buckets, message_sizes

    calls: List[Any] = []
    real_ar = dist.all_reduce

    def ar(data: torch.Tensor, **kw: Any) -> Any:
        calls.append((data.numel(), data.data_ptr(), kw.get("async_op", False)))
        return real_ar(data, **kw)
    monkeypatch.setattr(dist, "all_reduce", ar)
    nbytes = 30 * 1024**2  # past one bucket, as DLRM's data-parallel tables' gradients (47.6 MB) are
    collective_samples("all_reduce", one_rank, 1, nbytes, torch.device("cpu"), Repeats(2, 2))
    per_call = ddp_buckets(nbytes // 4)
    assert [n for n, _, _ in calls[:len(per_call)]] == per_call == [DDP_BUCKET // 4, (nbytes - DDP_BUCKET) // 4]
    assert len(calls) == 3 * len(per_call) and all(a for _, _, a in calls)  # all in flight before any is waited for
    assert len({p for _, p, _ in calls}) == len(per_call)  # in place, on the same buckets every call
    # on CPU the grid reaches past one bucket, so a data-parallel table's all-reduce is measured, not extrapolated
    assert max(message_sizes("cpu", "full", None)) > DDP_BUCKET


def test_the_tiny_table_job_trains_in_interleaved_rounds_also_with_gradient_accumulation(one_rank: Any) -> None:
    # every run's job built once and trained a few steps per round, in turn; with gradient accumulation the split
    # step's no_sync micro-batches need DDP without its static graph, as training wraps it (with it: "INTERNAL ASSERT
    # FAILED ... expect_autograd_hooks_" at the first backward)
    import functools

    from conftest import cfg_for

    from runner.train.calibrate import _tiny_job, tiny_job_rounds

    cfg = cfg_for("train.grad_accumulation_steps=2", "train.threads_per_worker=1")
    device = torch.device("cpu")
    make = functools.partial(_tiny_job, cfg, 0, 1, 1, device)
    seen: List[Any] = []
    got = tiny_job_rounds(make, [("table_wise", 16), ("row_wise", 16)], device, 2,
                          lambda phase, done, of: seen.append((done, of)))
    assert {run: len(v) for run, v in got.items()} == {("table_wise", 16): 2, ("row_wise", 16): 2}
    assert all(ms > 0 for v in got.values() for ms in v) and seen == [(1, 2), (2, 2)]
