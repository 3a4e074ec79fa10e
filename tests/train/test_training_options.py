"""Training options: schedules, optimizers, precision, models, reproducibility."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import FAST, finished_run, metric_history, run_cli, runs, stderr_lines
from omegaconf import OmegaConf

from runner.config.schema import ScheduleSchema
from runner.train.checkpoint import complete_checkpoints
from runner.train.optimizers import lr_factor


def schedule(**kw):
    return OmegaConf.merge(OmegaConf.structured(ScheduleSchema), kw)


def test_schedules() -> None:
    warm = schedule(name="constant", warmup_steps=4)
    assert [lr_factor(warm, s, 100) for s in (1, 2, 4, 5, 99)] == [0.25, 0.5, 1.0, 1.0, 1.0]
    exp = schedule(name="exp_decay", decay_rate=0.5, decay_steps=10, min_factor=0.2)
    assert lr_factor(exp, 10, 100) == pytest.approx(0.5) and lr_factor(exp, 1000, 100) == 0.2
    steps = schedule(name="steps", milestones=[10, 20], gamma=0.1)
    assert [lr_factor(steps, s, 100) for s in (9, 10, 19, 20)] == pytest.approx([1, 0.1, 0.1, 0.01])
    cos = schedule(name="cosine", warmup_steps=10, min_factor=0.1)
    assert lr_factor(cos, 5, 110) == 0.5 and lr_factor(cos, 10, 110) == 1.0
    assert lr_factor(cos, 60, 110) == pytest.approx(0.55) and lr_factor(cos, 110, 110) == pytest.approx(0.1)


def test_loop_schedule_equals_the_config_schedule() -> None:
    """The training loop's plain-Python copy of the schedules gives the config's rates at every step."""
    from runner.config.schema import RunnerConfig
    from runner.train.optimizers import Schedule, scheduled_rates

    o = OmegaConf.merge(OmegaConf.structured(RunnerConfig).optimizer, {
        "sparse_lr": 0.1, "dense_lr": 0.01,
        "sparse_schedule": {"name": "steps", "milestones": [5, 9], "gamma": 0.5, "warmup_steps": 2},
        "dense_schedule": {"name": "cosine", "warmup_steps": 3, "min_factor": 0.1}})
    loop = Schedule(o, 20)
    rates = [loop(s) for s in range(1, 21)]
    assert rates == [scheduled_rates(o, s, 20) for s in range(1, 21)]
    assert rates[0] == pytest.approx((0.05, 0.01 / 3)) and rates[-1] == pytest.approx((0.025, 0.001))


@pytest.mark.slow
def test_schedules_optimizers_clipping_dcn_and_quantised_comms_train(store: str, tmp_path: Path) -> None:
    proc, run = finished_run(store, "opts", tmp_path, [
            *FAST, "train.log_every=5", "model=dcn", "sharding=rowwise", "optimizer=adagrad_adamw",
            "precision=bf16_qcomm", "optimizer.dense_schedule.name=cosine",
            "optimizer.dense_schedule.warmup_steps=10", "optimizer.sparse_schedule.name=steps",
            "optimizer.sparse_schedule.milestones=[15]", "optimizer.clip.kind=norm", "optimizer.clip.max=0.5"])
    dense = metric_history(store, run.info.run_id, "train/lr_dense")
    sparse = metric_history(store, run.info.run_id, "train/lr_sparse")
    # logged at steps 5, 10, ..., 30 (the rate of the window's last step)
    assert dense == pytest.approx([1e-3 * s / 10 for s in (5, 10)] + [
        1e-3 * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * (s - 10) / 20)).item()) for s in (15, 20, 25, 30)])
    assert sparse == pytest.approx([0.05, 0.05, 0.005, 0.005, 0.005, 0.005])
    losses = metric_history(store, run.info.run_id, "train/loss")
    assert losses[-1] < losses[0]
    assert run.data.params["precision.qcomm_forward"] == "fp16" and run.data.params["model.family"] == "dcn"


@pytest.mark.slow
def test_deepfm_with_fp16_tables_and_sgd_trains(store: str, tmp_path: Path) -> None:
    proc, run = finished_run(store, "fp16", tmp_path, [
            *FAST, "model=deepfm", "precision=fp16_tables", "optimizer=sgd_sgd"])
    losses = metric_history(store, run.info.run_id, "train/loss")
    assert losses[-1] < losses[0]
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    (ckpt,) = complete_checkpoints(tmp_path / "checkpoints")
    dcp_to_torch_save(str(ckpt), str(tmp_path / "flat.pt"))
    model = torch.load(tmp_path / "flat.pt", weights_only=False)["model"]
    weights = {k: v for k, v in model.items() if "embedding_bags" in k}
    assert len(weights) == 6 and all(v.dtype == torch.float16 for v in weights.values())


@pytest.mark.slow
def test_gpu_only_optimizer_is_refused_on_cpu_in_one_line(store: str, tmp_path: Path) -> None:
    proc = run_cli(["optimizer=adam_adam", f"tracking.uri={store}", "tracking.experiment=gpu_only",
                    f"hydra.run.dir={tmp_path}"])
    assert proc.returncode != 0
    err = [ln for ln in stderr_lines(proc.stderr) if ln.startswith("error:")]
    assert len(err) == 1 and "optimizer.sparse='adam'" in err[0] and "rowwise_adagrad" in err[0], proc.stderr


@pytest.mark.slow
def test_same_config_and_seed_give_identical_losses(store: str, tmp_path: Path) -> None:
    results = []
    for name in ("a", "b"):
        proc = run_cli([*FAST, "train.log_every=5", "sharding=rowwise", "train.seed=7", f"tracking.uri={store}",
                        "tracking.experiment=repro", f"hydra.run.dir={tmp_path / name}"])
        assert proc.returncode == 0, proc.stderr[-3000:]
        results.append(json.loads((tmp_path / name / "results.json").read_text()))
    assert results[0]["losses"] == results[1]["losses"] and len(results[0]["losses"]) == 6
    assert results[0]["eval_auc"] == results[1]["eval_auc"]
    assert all(r.data.params["train.seed"] == "7" for r in runs(store, "repro"))


def test_synthetic_data_zipf_and_multi_hot() -> None:
    from runner.data.synthetic import SyntheticClicks

    def batch(**kw):
        return next(iter(SyntheticClicks(["a", "b"], [100000, 1000], 13, 1024, 3, 0, 0, **kw)))

    uniform, skewed = batch(), batch(zipf_alpha=1.05)
    top = [torch.bincount(x.sparse_features["a"].values()).max().item() for x in (uniform, skewed)]
    assert top[0] <= 4 and top[1] > 20  # power law: a few ids carry much of the traffic
    multi = batch(ids_per_feature=3, variable_lengths=True, zipf_alpha=1.05)
    lengths = multi.sparse_features.lengths()
    assert lengths.min() >= 1 and lengths.max() <= 5 and 2.5 < lengths.float().mean() < 3.5
    assert int(lengths.sum()) == multi.sparse_features.values().numel()
    values = multi.sparse_features["b"].values()
    assert values.min() >= 0 and values.max() < 1000
    again = batch(ids_per_feature=3, variable_lengths=True, zipf_alpha=1.05)
    assert torch.equal(again.sparse_features.values(), multi.sparse_features.values())


@pytest.mark.slow
def test_multi_hot_power_law_data_trains(store: str, tmp_path: Path) -> None:
    proc, run = finished_run(store, "multihot", tmp_path, [
            *FAST, "data.ids_per_feature=3", "data.variable_lengths=true", "data.zipf_alpha=1.05"])
    losses = metric_history(store, run.info.run_id, "train/loss")
    assert losses[-1] < losses[0]
    assert run.data.params["data.zipf_alpha"] == "1.05"


@pytest.mark.slow
def test_grad_accumulation_equals_the_larger_batch(store: str, tmp_path: Path) -> None:
    """2 micro-batches of 64 per step give the losses and eval of one batch of 128 (same samples)."""
    results = {}
    for name, batch, accum in (("big", 128, 1), ("accum", 64, 2)):
        proc = run_cli(["train.steps=20", "train.log_every=5", "data.eval_batches=2", f"train.batch_size={batch}",
                        f"train.grad_accumulation_steps={accum}", "sharding=rowwise",
                        "train.checkpoint.enabled=false", f"tracking.uri={store}", "tracking.experiment=accum",
                        f"hydra.run.dir={tmp_path / name}"])
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = json.loads((tmp_path / name / "results.json").read_text())
    big, acc = results["big"], results["accum"]
    assert len(big["losses"]) == 4 and big["losses"][-1] < big["losses"][0]
    assert acc["losses"] == pytest.approx(big["losses"], rel=1e-4, abs=1e-5)
    assert acc["eval_auc"] == pytest.approx(big["eval_auc"], abs=1e-4)
    # and it is not the 64-sample batch's result
    proc = run_cli(["train.steps=20", "train.log_every=5", "data.eval_batches=2", "train.batch_size=64",
                    "sharding=rowwise", "train.checkpoint.enabled=false", f"tracking.uri={store}",
                    "tracking.experiment=accum", f"hydra.run.dir={tmp_path / 'small'}"])
    small = json.loads((tmp_path / "small" / "results.json").read_text())
    assert small["losses"] != pytest.approx(big["losses"], rel=1e-3)
    params = {r.data.params["train.grad_accumulation_steps"] for r in runs(store, "accum")}
    assert params == {"1", "2"}


@pytest.mark.slow
def test_fp16_autocast_with_loss_scaling_skips_overflow_and_trains(store: str, tmp_path: Path) -> None:
    # a scale of 2^40 overflows fp16 gradients: those steps are skipped on every rank, the scale backs off
    proc, run = finished_run(store, "fp16amp", tmp_path, [
            *FAST, "train.log_every=5", "precision=fp16", "precision.grad_scaler.init_scale=1099511627776",
            "precision.grad_scaler.growth_interval=10", "sharding=tablewise"])
    scale = metric_history(store, run.info.run_id, "train/loss_scale")
    skipped = metric_history(store, run.info.run_id, "train/skipped_steps")
    assert scale[0] < 2.0**40 and skipped[-1] >= 1 and skipped[-1] < 30
    assert max(scale[1:]) > scale[0] or skipped[-1] > skipped[0]  # it grows again, or keeps backing off
    losses = metric_history(store, run.info.run_id, "train/loss")
    assert all(x == x for x in losses) and losses[-1] < losses[0]
    assert 0.55 < run.data.metrics["eval/auc"] <= 1.0
    assert run.data.params["precision.autocast"] == "float16"
    # the scale is checkpointed and a resumed job goes on from it, not from init_scale
    (ckpt,) = complete_checkpoints(tmp_path / "checkpoints")
    saved = json.loads((ckpt / "meta.json").read_text())["loss_scale"]
    assert saved["scale"] == scale[-1] and saved["skipped"] == skipped[-1]
    _, resumed = finished_run(store, "fp16amp_resume", tmp_path / "resumed", [
            *FAST, "train.steps=40", "train.log_every=5", "precision=fp16",
            "precision.grad_scaler.init_scale=1099511627776", "precision.grad_scaler.growth_interval=10",
            "sharding=tablewise", f"train.resume={ckpt}"])
    again = metric_history(store, resumed.info.run_id, "train/loss_scale")
    assert len(again) == 2 and again[0] <= saved["scale"] * 2
    assert metric_history(store, resumed.info.run_id, "train/skipped_steps")[0] >= saved["skipped"]


@pytest.mark.slow
def test_mmoe_trains_two_tasks_and_logs_each(store: str, tmp_path: Path) -> None:
    proc, run = finished_run(store, "mmoe", tmp_path, [*FAST, "train.steps=40", "model=mmoe", "sharding=tablewise"])
    m = run.data.metrics
    for task in ("click", "conversion"):
        losses = metric_history(store, run.info.run_id, f"train/{task}/loss")
        assert len(losses) == 4 and losses[-1] < losses[0], (task, losses)
        assert m[f"eval/{task}/auc"] > 0.55
        assert 0.0 < m[f"eval/{task}/positive_rate"] < 1.0
    assert m["eval/auc"] == pytest.approx((m["eval/click/auc"] + m["eval/conversion/auc"]) / 2)
    total = metric_history(store, run.info.run_id, "train/loss")
    parts = [metric_history(store, run.info.run_id, f"train/{t}/loss") for t in ("click", "conversion")]
    assert total == pytest.approx([a + b for a, b in zip(*parts, strict=True)], rel=1e-4)


@pytest.mark.parametrize("name,cls,extra", [
    ("adam", torch.optim.Adam, {}), ("adamw", torch.optim.AdamW, {}), ("adagrad", torch.optim.Adagrad, {}),
    ("sgd", torch.optim.SGD, {"momentum": 0.9}),
])
def test_dense_optimizers_and_value_clipping(name: str, cls: type, extra: dict) -> None:
    from runner.config.schema import OptimizerSchema
    from runner.train.optimizers import dense_optimizer

    o = OmegaConf.merge(OmegaConf.structured(OptimizerSchema), {
        "dense": name, "dense_lr": 1.0, "dense_momentum": 0.9, "clip": {"kind": "value", "max": 0.01}})
    model = torch.nn.Linear(4, 1, bias=False)
    opt = dense_optimizer(model, o)
    inner = opt._optimizer  # the torch optimizer TorchRec's KeyedOptimizerWrapper holds
    assert type(inner) is cls and all(inner.param_groups[0][k] == v for k, v in extra.items())
    assert inner.param_groups[0]["fused"] is True  # optimizer.dense_fused's default
    model.weight.grad = torch.full_like(model.weight, 100.0)
    opt.step()
    assert model.weight.grad.abs().max().item() == pytest.approx(0.01)  # clipped before the step
    # the fused kernel makes the update of torch's default implementation, up to float rounding
    pair = [torch.nn.Linear(4, 1, bias=False) for _ in range(2)]
    with torch.no_grad():
        pair[1].weight.copy_(pair[0].weight)
    before = pair[0].weight.detach().clone()
    steps = [dense_optimizer(m, OmegaConf.merge(o, {"dense_fused": fused}))
             for m, fused in zip(pair, (True, False), strict=True)]
    assert not steps[1]._optimizer.param_groups[0]["fused"]
    for i in range(3):
        for m, step in zip(pair, steps, strict=True):
            m.weight.grad = torch.linspace(-0.004, 0.005 * (i + 1), 4).reshape(1, 4)  # inside the clip
            step.step()
    assert not torch.equal(pair[0].weight, before)
    torch.testing.assert_close(pair[0].weight, pair[1].weight, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_dense_adagrad_sparse_decoupled_decay_and_exp_decay_train(store: str, tmp_path: Path) -> None:
    proc, run = finished_run(store, "decay", tmp_path, [
            *FAST, "train.log_every=5", "optimizer=adagrad_adamw", "optimizer.dense=adagrad",
            "optimizer.dense_lr=0.01", "optimizer.clip.kind=value", "optimizer.clip.max=0.1",
            "optimizer.sparse_weight_decay=0.0001", "optimizer.sparse_weight_decay_mode=decoupled",
            "optimizer.sparse_schedule.name=exp_decay", "optimizer.sparse_schedule.decay_steps=10",
            "optimizer.sparse_schedule.min_factor=0.3"])
    sparse = metric_history(store, run.info.run_id, "train/lr_sparse")
    assert sparse == pytest.approx([0.05 * max(0.3, 0.5 ** (s / 10)) for s in (5, 10, 15, 20, 25, 30)])
    losses = metric_history(store, run.info.run_id, "train/loss")
    assert losses[-1] < losses[0]
    assert run.data.params["optimizer.sparse_weight_decay_mode"] == "decoupled"


def test_a_window_is_timed_once_the_device_has_done_its_work() -> None:
    """The loop's clock is read after the device finished the window's steps (CUDA queues them): here a
    device still busy for 0.2 s when the window closes."""
    import time

    from runner.train.loop import _Window, device_sync

    window = _Window(1, torch.device("cpu"))
    window.sync = lambda: time.sleep(0.2)
    window.add(torch.tensor(1.0), None)
    means, steps, elapsed = window.close(last=True)
    assert steps == 1 and float(means[0]) == 1.0 and elapsed >= 0.2
    assert device_sync(torch.device("cpu"))() is None


def test_a_dense_part_that_cannot_fit_is_refused_before_it_is_allocated() -> None:
    """The dense part is sized on meta before it is built on the worker's device: 78 G parameters (290 GiB) are
    refused in one line naming the key and the sizes, not allocated (or killed by the kernel mid-way)."""
    import torch
    from conftest import cfg_for

    from runner.config.errors import ConfigError
    from runner.train.models import build_model

    cfg = cfg_for("model.dense_arch_layer_sizes=[1000000000,64]")
    with pytest.raises(ConfigError) as e:
        build_model(cfg, torch.device("cpu"))
    assert str(e.value).startswith("data.num_dense_features=13 is not allowed; expected a dense part that fits: with "
                                   "it the model's dense parameters alone take 290.57 GiB on each worker"), str(e.value)
    assert "(model.dense_arch_layer_sizes=[1000000000, 64])" in str(e.value)
