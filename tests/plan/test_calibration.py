"""Calibration: the fits recover known constants, the file round-trips and is refused in one line when it cannot be
used, ``auto`` takes only this hardware's, ``none`` is TorchRec's model unchanged, and a plan made with a
calibration uses its constants (TorchRec's estimator with the same topology gives the same numbers) and says so."""

from __future__ import annotations

import dataclasses
import random
import shutil
import statistics
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml
from conftest import cfg_for
from torchrec.distributed.planner import Topology

import runner.cli  # noqa: F401  (schema and resolvers)
from runner.config.errors import ConfigError
from runner.launch.sweep.precheck import precheck
from runner.plan.cost import calibration as cal_mod
from runner.plan.cost import trust as cost_fit
from runner.plan.cost.calibration import Calibration, load_calibration, save
from runner.plan.cost.choice import for_job
from runner.plan.cost.fit import (
    GIB,
    fit_all,
    fit_collective,
    fit_kernels,
    fit_lookups,
    fit_rate,
    kernel_bytes,
    lookup_bytes_ms,
)
from runner.plan.cost.step_estimate import PARTS
from runner.plan.cost.topology import build_topology, gibps_to_bytes_per_ms, topology_knobs
from runner.plan.spec import plan_spec
from runner.runtime.hardware import fingerprint

KNOWN = {"device_bw_gibps": 17.5, "kernel_call_fwd_ms": 0.21, "kernel_call_bwd_ms": 0.13, "bwd_compute_multiplier": 6.4}


def _kernel_points() -> List[Dict[str, Any]]:
    per_byte = 1000.0 / (KNOWN["device_bw_gibps"] * GIB)
    out = []
    for dim in (16, 64, 256):
        for pooling in (1, 8):
            for batch in (256, 2048):
                x = kernel_bytes(batch, pooling, dim) * per_byte
                out.append({"batch": batch, "pooling": pooling, "dim": dim, "rows": 1000,
                            "fwd_ms": KNOWN["kernel_call_fwd_ms"] + x,
                            "bwd_ms": KNOWN["kernel_call_bwd_ms"] + KNOWN["bwd_compute_multiplier"] * x})
    return out


def test_the_fits_recover_the_constants_the_measurements_were_made_from() -> None:
    got = fit_kernels(_kernel_points())
    for key, value in KNOWN.items():
        assert got[key] == pytest.approx(value, rel=0.02), key
    sizes = [4096 * 4**k for k in range(7)]
    coll = fit_collective([{"bytes": s, "ms": 0.15 + s / (2.5 * GIB) * 1000} for s in sizes])
    assert coll["latency_ms"] == pytest.approx(0.15, rel=0.02)
    assert coll["bandwidth_gibps"] == pytest.approx(2.5, rel=0.02)
    dense = fit_rate([{"gflops": g, "ms": 0.4 + 20 * g} for g in (0.01, 0.02, 0.04)], "gflops")
    assert dense["fixed_ms"] == pytest.approx(0.4, rel=0.02) and dense["ms_per_unit"] == pytest.approx(20, rel=0.02)


def test_a_fit_whose_free_line_has_a_negative_term_is_the_best_line_without_one() -> None:
    # times falling with size (noise over a size that barely shows): the weighted mean, not an intercept above
    # every point with its slope cut to 0
    times = [0.90, 0.94, 0.86]
    flat = fit_rate([{"gflops": g, "ms": t} for g, t in zip((0.01, 0.02, 0.04), times, strict=True)], "gflops")
    w = [1 / t**2 for t in times]
    assert flat["ms_per_unit"] == 0.0
    assert flat["fixed_ms"] == pytest.approx(sum(wi * t for wi, t in zip(w, times, strict=True)) / sum(w))
    assert min(times) < flat["fixed_ms"] < max(times) and flat["fit_error"] < 0.06
    # a free intercept below 0: the line through the origin, and its error is the returned line's
    steep = fit_rate([{"gflops": g, "ms": t} for g, t in ((1.0, 1.0), (2.0, 2.6), (4.0, 5.6))], "gflops")
    assert steep["fixed_ms"] == 0.0 and 1.0 < steep["ms_per_unit"] < 1.4  # between the points' own ratios
    assert steep["fit_error"] == pytest.approx(max(abs(steep["ms_per_unit"] * g - t) / t
                                                   for g, t in ((1.0, 1.0), (2.0, 2.6), (4.0, 5.6))))


def _measured(noise: float = 0.0, ranks: int = 2, repeats: int = 5) -> Dict[str, Any]:
    """Measurements as every rank gathers them, made from known constants (``noise``: relative jitter)."""
    rnd = random.Random(7)

    def samples(ms: float) -> List[List[float]]:
        return [[ms * (1 + rnd.uniform(-noise, noise)) for _ in range(repeats)] for _ in range(ranks)]
    sizes = [4096 * 4**k for k in range(5)]
    coll = {n: {"intra": {s: samples(0.1 + s / (2 * GIB) * 1000) for s in sizes}}
            for n in ("all_to_all", "all_reduce", "reduce_scatter")}
    kernels = [{"shape": {k: p[k] for k in ("rows", "dim", "pooling", "batch")}, "fwd": samples(p["fwd_ms"]),
                "bwd": samples(p["bwd_ms"])} for p in _kernel_points()]
    params = 30_000
    dense = {r: {"fwd": samples(0.3 + 25 * 2 * params * r / 1e9), "bwd": samples(0.4 + 80 * 2 * params * r / 1e9),
                 "optimizer": samples(0.15)} for r in (64, 128, 256)}
    # 2.0 (0.6) + 0.3 (0.1) per table + 1 (0.5) per table x 1,000 samples, beyond what TorchRec's terms charge the
    # tiny tables' bytes on 2 ranks (the kernel at the known constants, the output's all-to-all at 2 GiB/s)
    known = {**KNOWN, "collectives": {"all_to_all": {"intra": {"bandwidth_gibps": 2.0}}}}

    def lookup(kind: str, n: int, b: int) -> Dict[str, Any]:
        return {"fwd": samples(2.0 + 0.3 * n + n * b / 1000 + lookup_bytes_ms(known, kind, n, b, 2, "fwd")),
                "bwd": samples(0.6 + 0.1 * n + n * b / 2000 + lookup_bytes_ms(known, kind, n, b, 2, "bwd"))}
    sharded = {k: {n: {b: lookup(k, n, b) for b in (64, 512, 4096)} for n in (1, 8)}
               for k in ("table_wise", "row_wise", "data_parallel")}
    return {"collectives": coll, "kernels": kernels, "sharded": sharded, "dense": dense, "params": params,
            "job": {"world": 2},
            "optimizer": {n: samples(0.1 + 0.5 * n / 1e6) for n in (params, 4 * params, 16 * params)},
            "input": {r: samples(0.01 + r / 100_000) for r in (64, 256)},
            "probe": {"compute": samples(2.0), "memory": samples(4.0)}}


def _calibration(**fp: Any) -> Calibration:
    constants, spreads, errors = fit_all(_measured())
    return Calibration({**fingerprint("cpu", 1, 2), **fp}, constants, spreads, {p: True for p in cost_fit.PARTS}, {},
                       "2026-11-27T00:00:00Z", errors)


def test_fit_all_recovers_every_part_from_every_rank_s_samples() -> None:
    constants, spreads, errors = fit_all(_measured())
    assert constants["device_bw_gibps"] == pytest.approx(KNOWN["device_bw_gibps"], rel=0.02)
    assert constants["intra_node_bandwidth"] == pytest.approx(2.0, rel=0.02)
    assert constants["cross_node_bandwidth"] is None  # one node: not measured
    assert constants["dense_fwd"]["ms_per_gflop"] == pytest.approx(25, rel=0.02)
    assert constants["optimizer"]["ms_per_mparam"] == pytest.approx(0.5, rel=0.02)
    # each family's sharded lookup beyond its bytes (which the step's embeddings part charges); fitted with its bytes
    # in, the table-wise backward's cost per table and sample would charge them twice
    for kind in ("table_wise", "row_wise", "data_parallel"):
        lookups = constants["sharded"][kind]
        assert lookups["fwd"]["fixed_ms"] == pytest.approx(2.0, rel=0.02)
        assert lookups["fwd"]["per_table_ms"] == pytest.approx(0.3, rel=0.02)
        assert lookups["bwd"]["ms_per_table_ksample"] == pytest.approx(0.5, rel=0.02)
    with_bytes = fit_lookups(_measured()["sharded"]["table_wise"], "bwd", {}, {})
    assert with_bytes["ms_per_table_ksample"] > 1.05 * constants["sharded"]["table_wise"]["bwd"]["ms_per_table_ksample"]
    assert max(spreads.values()) == 0.0 and max(errors.values()) == 0.0
    assert all(cost_fit.trust(errors, constants, 0.1).values())
    _, noisy, noisy_errors = fit_all(_measured(noise=0.6))
    assert max(noisy.values()) > 0.25  # a busy machine's repeats scatter: calibrate.max_spread says so
    noisy_trust = cost_fit.trust(noisy_errors, constants, cost_fit.allowed_median_error(0.25, 5))
    assert not (noisy_trust["collectives"] or noisy_trust["kernels"] or noisy_trust["dense"]), noisy_trust


def test_a_calibration_round_trips_and_a_damaged_or_newer_file_is_refused_in_one_line(tmp_path: Path) -> None:
    cal = _calibration()
    path = save(cal, tmp_path / "x.calibration.yaml")
    back = load_calibration(path)
    assert dataclasses.replace(back, path=None) == cal
    cases = {"garbage": ": : [", "notmapping": "[1, 2]", "noformat": "{a: 1}",
             "newer": yaml.safe_dump({**yaml.safe_load(path.read_text()), "format": cal_mod.FORMAT + 1}),
             "noconstants": yaml.safe_dump({"format": 1, "fingerprint": {}, "constants": {"device_bw_gibps": 1}})}
    for name, text in cases.items():
        bad = tmp_path / f"{name}.yaml"
        bad.write_text(text)
        with pytest.raises(ConfigError) as err:
            load_calibration(bad)
        line = str(err.value)
        assert "\n" not in line and line.startswith(f"cluster.calibration='{bad}' cannot be used"), line
    assert "newer than this runner's" in _refusal(tmp_path / "newer.yaml")
    # the pre-check refuses it before anything starts
    error, _ = precheck([f"cluster.calibration={tmp_path / 'garbage.yaml'}"])
    assert error is not None and "cluster.calibration=" in error and "cannot be used" in error


def _refusal(path: Path) -> str:
    with pytest.raises(ConfigError) as err:
        load_calibration(path)
    return str(err.value)


def test_auto_takes_the_newest_of_this_hardware_and_a_mismatched_file_is_refused(tmp_path: Path) -> None:
    cfg = cfg_for(f"cluster.calibration_dir={tmp_path}")
    assert for_job(cfg.cluster, "cpu", True).calibration is None  # an empty folder: TorchRec's constants, said
    assert "no calibration of this hardware" in for_job(cfg.cluster, "cpu", True).note
    save(_calibration(device_name="another CPU"), tmp_path / f"20260101-000000-other{cal_mod.SUFFIX}")
    save(dataclasses.replace(_calibration(), trusted={p: False for p in cost_fit.PARTS}),
         tmp_path / f"20270101-000000-busy{cal_mod.SUFFIX}")
    mine = save(_calibration(), tmp_path / f"20260601-000000-mine{cal_mod.SUFFIX}")
    save(_calibration(workers_per_node=4), tmp_path / f"20260701-000000-other-world{cal_mod.SUFFIX}")
    chosen = for_job(cfg.cluster, "cpu", True)
    assert chosen.calibration is not None and chosen.calibration.path == str(mine), chosen.note
    # a plan for a cluster that is not here takes one of the same world first, else another world's
    assert for_job(cfg.cluster, "cpu", False).calibration.path == str(mine)
    assert for_job(cfg_for(f"cluster.calibration_dir={tmp_path}", "cluster.workers_per_node=8").cluster, "cpu",
                   False).calibration.path.endswith(f"other-world{cal_mod.SUFFIX}")
    other = cfg_for(f"cluster.calibration={tmp_path}/20260101-000000-other{cal_mod.SUFFIX}")
    with pytest.raises(ConfigError, match="made on other hardware \\(device_name"):
        for_job(other.cluster, "cpu", True)
    # planning a GPU cluster here: a CPU calibration is refused, a GPU one taken
    with pytest.raises(ConfigError, match="made on cpu, the plan is for cuda"):
        for_job(other.cluster, "cuda", False)
    gpu = save(_calibration(device_kind="cuda", device_name="NVIDIA H200"), tmp_path / "h200.yaml")
    assert for_job(cfg_for(f"cluster.calibration={gpu}").cluster, "cuda", False).calibration is not None


def test_none_is_torchrec_s_topology_and_a_calibration_sets_its_knobs() -> None:
    cfg = cfg_for("cluster.calibration=none")
    plain = build_topology(cfg.cluster, 2, 2, "cpu")
    stock = Topology(world_size=2, local_world_size=2, compute_device="cpu",
                     intra_host_bw=gibps_to_bytes_per_ms(600), inter_host_bw=gibps_to_bytes_per_ms(12.5))
    for knob in ("ddr_mem_bw", "hbm_mem_bw", "bwd_compute_multiplier", "intra_host_bw", "inter_host_bw"):
        assert getattr(plain, knob) == getattr(stock, knob), knob
    cal = _calibration()
    calibrated = build_topology(cfg.cluster, 2, 2, "cpu", calibration=cal)
    assert calibrated.ddr_mem_bw == pytest.approx(gibps_to_bytes_per_ms(cal.constants["device_bw_gibps"]))
    assert calibrated.bwd_compute_multiplier == pytest.approx(cal.constants["bwd_compute_multiplier"])
    assert calibrated.intra_host_bw == pytest.approx(gibps_to_bytes_per_ms(cal.constants["intra_node_bandwidth"]))
    # a bandwidth the user set wins over the measured one (a sweep over it asks "what if"), TorchRec's value too
    assert topology_knobs(cal, "cpu", 100.0, None)[1]["intra"] == 100.0
    assert topology_knobs(cal, "cpu", 600.0, None)[1]["intra"] == 600.0


def _plan(cfg: Any, out: Path) -> Any:
    from runner.plan.planner import make_plan
    from runner.plan.report import write_plan_report
    from runner.train.models import planning_model

    facts: Dict[str, Any] = {}
    plan, best, seconds, _ = make_plan(plan_spec(cfg), planning_model(cfg), 2, 2, "cpu", facts=facts)
    return best, write_plan_report(plan_spec(cfg), plan, best, 2, 2, "cpu", out, seconds, "", facts)


def test_a_plan_made_with_a_calibration_says_so_and_estimates_the_whole_step(tmp_path: Path) -> None:
    from runner.plan.planner import PlanEstimates, torchrec_planner
    from runner.plan.sharders import sharders_for
    from runner.train.models import planning_model

    cal = _calibration()
    path = save(cal, tmp_path / "c.yaml")
    cfg = cfg_for("mode=plan", f"cluster.calibration={path}", "sharding=rowwise")
    best, report = _plan(cfg, tmp_path / "with")
    m, text = report.metrics, (tmp_path / "with" / "report.md").read_text()
    assert report.tags["runner.calibration"] == str(path)
    parts = [v for k, v in m.items() if k.startswith("plan/step/") and k.endswith("_ms")]
    assert m["plan/est_whole_step_ms"] == pytest.approx(sum(parts)) and len(parts) == len(PARTS)
    assert m["plan/est_whole_step_ms"] > m["plan/est_step_ms"] > 0
    # the dense part from the calibration's rate and the model's dense parameters at the job's batch
    assert m["plan/step/dense_forward_ms"] > cal.constants["dense_fwd"]["fixed_ms"]
    assert f"Cost model: calibration {path}" in text
    assert "Estimated step" in text and "| sharded lookups |" in text
    assert "estimated step" in report.console and "embeddings rated" in report.console
    # TorchRec's own planner, given the same config, plans with the same constants: the same shard estimates
    theirs = PlanEstimates()
    torchrec_planner(plan_spec(cfg), 2, 2, "cpu", theirs).plan(planning_model(cfg), sharders_for(cfg.precision))
    ours_perf = sorted(round(s.perf.total, 9) for o in best for s in o.shards)
    assert ours_perf == sorted(round(s.perf.total, 9) for o in theirs.best_plan for s in o.shards)
    # TorchRec's constants: a different estimate, and the report says only the embeddings are estimated
    _, plain = _plan(cfg_for("mode=plan", "cluster.calibration=none", "sharding=rowwise"), tmp_path / "none")
    assert plain.tags["runner.calibration"] == "none" and "plan/est_whole_step_ms" not in plain.metrics
    assert plain.metrics["plan/est_step_ms"] < m["plan/est_step_ms"]  # this machine is slower than TorchRec assumes
    assert "Only the embeddings are estimated" in (tmp_path / "none" / "report.md").read_text()
    assert "the embeddings only; TorchRec's default constants (cluster.calibration=none)" in plain.console


def test_a_new_calibration_is_another_answer_for_a_plan_only_job(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from runner.config.roles import config_hash
    from runner.plan.cost.choice import hashed

    cfg = cfg_for("mode=plan", f"cluster.calibration_dir={tmp_path}")
    config = OmegaConf.to_container(cfg, resolve=True)
    before = config_hash(hashed(cfg.cluster, cfg.mode, config))
    save(_calibration(), tmp_path / f"20260101-000000-mine{cal_mod.SUFFIX}")
    after = config_hash(hashed(cfg.cluster, cfg.mode, config))
    assert before != after
    assert hashed(cfg.cluster, cfg.mode, config)["cluster"]["calibration"].endswith("@2026-11-27T00:00:00Z")
    training = cfg_for(f"cluster.calibration_dir={tmp_path}")  # a training job's hash keeps the word
    kept = hashed(training.cluster, training.mode, OmegaConf.to_container(training, resolve=True))
    assert kept["cluster"]["calibration"] == "auto"


def test_the_uvm_caching_kernel_gives_torchrec_s_host_to_gpu_bandwidth() -> None:
    from runner.plan.cost.fit import fit_uvm

    hbm, h2d = 900.0, 40.0  # GiB/s; TorchRec's UVM-caching bandwidth is (0.2 x HBM + 0.8 x host-to-GPU) / 10
    per_byte = 1000.0 / ((0.2 * hbm + 0.8 * h2d) / 10 * GIB)
    points = [{"batch": b, "pooling": p, "dim": d, "fwd_ms": 0.05 + kernel_bytes(b, p, d) * per_byte,
               "bwd_ms": 0.1 + 3 * kernel_bytes(b, p, d) * per_byte}
              for b in (2048, 65536) for p in (1, 32) for d in (64, 256)]
    assert fit_uvm(points, hbm)["hbm_to_ddr_gibps"] == pytest.approx(h2d, rel=0.02)
    cal = _calibration(device_kind="cuda")
    cal.constants["uvm_caching"] = fit_uvm(points, hbm)
    knobs, _ = topology_knobs(cal, "cuda", None, None)
    assert knobs["hbm_to_ddr_mem_bw"] == pytest.approx(gibps_to_bytes_per_ms(h2d), rel=0.02)
    assert "hbm_to_ddr_mem_bw" not in topology_knobs(cal, "cpu", None, None)[0]
    # a fit above any host link (an H100's UVM test table migrated to the GPU: 716 GiB/s) is reported, not used
    fast = 1000.0 / ((0.2 * hbm + 0.8 * 716.0) / 10 * GIB)
    migrated = fit_uvm([{**p, "fwd_ms": 0.05 + kernel_bytes(p["batch"], p["pooling"], p["dim"]) * fast}
                        for p in points], hbm)
    assert migrated["hbm_to_ddr_gibps"] is None and migrated["fitted_hbm_to_ddr_gibps"] == pytest.approx(716, rel=0.02)
    cal.constants["uvm_caching"] = migrated
    assert "hbm_to_ddr_mem_bw" not in topology_knobs(cal, "cuda", None, None)[0]


def _scattered_collectives(repeats: int) -> Dict[str, Any]:
    """Measurements whose collectives alone scatter (+-80%, ``repeats`` each), the rest steady."""
    steady, noisy = _measured(), _measured(noise=0.8, repeats=repeats)
    return {**steady, "collectives": noisy["collectives"]}


def test_one_scattered_part_falls_back_alone_and_the_plan_line_names_it(tmp_path: Path) -> None:
    from runner.plan.cost.fit import _trust_words

    constants, spreads, errors = fit_all(_scattered_collectives(5))
    allowed = cost_fit.allowed_median_error(0.25, 5)
    parts = cost_fit.trust(errors, constants, allowed)
    assert parts == {"collectives": False, "kernels": True, "sharded": True, "dense": True}, errors
    # measured four times as often, the same scatter knows its medians within what 5 steady repeats allow
    many = cost_fit.trust(*fit_all(_scattered_collectives(80))[2:], constants, allowed)  # type: ignore[misc]
    assert many["collectives"], fit_all(_scattered_collectives(80))[2]
    cal = Calibration(fingerprint("cpu", 1, 2), constants, spreads, parts, {}, "2026-11-28T00:00:00Z", errors)
    settings = cfg_for("mode=calibrate", "calibrate.repeats=5").calibrate
    words = _trust_words(cal, settings, tmp_path / "kept.calibration.yaml")
    assert words.startswith("trusted: kernels, sharded, dense; not trusted: collectives (its medians known to")
    assert "TorchRec's bandwidths" in words and "the next plan here (cluster.calibration=auto) uses it" in words
    # auto takes it: the kernels' constants kept, the collectives' gone, and the note says so
    save(cal, tmp_path / f"20260601-000000-mine{cal_mod.SUFFIX}")
    chosen = for_job(cfg_for(f"cluster.calibration_dir={tmp_path}").cluster, "cpu", True)
    assert chosen.calibration is not None and "collectives not used (its repeats scattered)" in chosen.note
    knobs, bandwidths = topology_knobs(chosen.calibration, "cpu", None, None, 2, 2)
    assert knobs["ddr_mem_bw"] == pytest.approx(gibps_to_bytes_per_ms(constants["device_bw_gibps"]))
    assert bandwidths["intra"] == 600.0  # TorchRec's, as without a calibration: the all-to-all is not kept
    # (a collective whose own points happened to be known well enough is: the all-reduce answers for inter_host_bw)
    assert not constants["collectives"]["all_to_all"]["intra"]["trusted"]
    reduce = constants["collectives"]["all_reduce"]["intra"]
    assert bandwidths["cross"] == (reduce["bandwidth_gibps"] / 2 if reduce["trusted"] else 12.5)
    # a calibration whose every part fell back is not taken
    save(dataclasses.replace(cal, trusted={p: False for p in cost_fit.PARTS}),
         tmp_path / f"20270101-000000-none{cal_mod.SUFFIX}")
    assert for_job(cfg_for(f"cluster.calibration_dir={tmp_path}").cluster, "cpu", True).calibration.path.endswith(
        f"mine{cal_mod.SUFFIX}")


def test_a_collective_known_well_enough_alone_is_kept_when_the_collectives_part_falls_back(tmp_path: Path) -> None:
    # three collectives scatter (+-80%), the reduce-scatter is steady: the part is not trusted, the reduce-scatter is
    from runner.plan.cost.topology import measured_comms
    from runner.plan.cost.trust import fallen_back

    steady, noisy = _measured(), _measured(noise=0.8)
    coll = {n: (steady if n == "reduce_scatter" else noisy)["collectives"][n] for n in steady["collectives"]}
    constants, spreads, errors = fit_all({**steady, "collectives": coll})
    parts = cost_fit.trust(errors, constants, cost_fit.allowed_median_error(0.1, 5))
    assert not parts["collectives"] and parts["kernels"], errors
    assert {n: f["intra"]["trusted"] for n, f in constants["collectives"].items()} == {
        "all_to_all": False, "all_reduce": False, "reduce_scatter": True}
    cal = Calibration(fingerprint("cpu", 1, 2), constants, spreads, parts, {}, "2026-11-28T00:00:00Z", errors)
    used = fallen_back(cal)
    assert set(used.constants["collectives"]) == {"reduce_scatter"} and "intra_node_bandwidth" not in used.constants
    rs = constants["collectives"]["reduce_scatter"]["intra"]["bandwidth_gibps"]
    assert measured_comms(used, None, None) == {"reduce_scatter": {"intra": gibps_to_bytes_per_ms(rs)}}
    assert topology_knobs(used, "cpu", None, None, 2, 2)[1] == {"intra": 600.0, "cross": 12.5}  # TorchRec's
    save(cal, tmp_path / f"20260601-000000-mine{cal_mod.SUFFIX}")
    chosen = for_job(cfg_for(f"cluster.calibration_dir={tmp_path}").cluster, "cpu", True)
    assert "TorchRec's bandwidths; reduce_scatter (intra) kept, each known well enough alone" in chosen.note
    # a file without each collective's own trust (before it was marked) drops the whole part, as it did
    old = {**constants, "collectives": {n: {s: {k: v for k, v in f.items() if k not in ("trusted", "median_error")}
                                            for s, f in by.items()} for n, by in constants["collectives"].items()}}
    assert "collectives" not in fallen_back(cal.with_constants(old)).constants


def test_a_scattered_point_takes_more_repeats_until_its_median_is_known_within_its_time() -> None:
    import itertools
    import time

    from runner.train.timing import Repeats, timed

    rnd = random.Random(3)
    within = cost_fit.allowed_median_error(0.25, 7)
    plan = Repeats(7, 64, within, time.perf_counter() + 60)
    assert plan.more([1.0 * (1 + rnd.uniform(-0.05, 0.05)) for _ in range(7)]) == 0  # steady: known already
    scattered = [1.0 * (1 + rnd.uniform(-0.8, 0.8)) for _ in range(7)]
    assert cost_fit.median_error(scattered) > within and plan.more(scattered) == 7
    assert Repeats(7, 64, within, time.perf_counter() - 1).more(scattered) == 0  # out of time
    assert Repeats(7, 10, within, time.perf_counter() + 60).more(scattered) == 3  # up to max_repeats
    # timed(): a run whose times scatter is repeated until its median is known, within max_repeats
    times = itertools.cycle([0.3, 2.0, 3.4, 1.0, 3.0])  # ms: scattered by about 70%
    got = timed(lambda: time.sleep(next(times) / 1000), Repeats(7, 200, within, time.perf_counter() + 60),
                lambda: None)
    assert 14 <= len(got) < 200 and cost_fit.median_error(got) <= within
    assert cost_fit.median_error(got[:7]) > within


def test_the_parts_share_the_extra_time_in_their_order() -> None:
    """The extra rounds' seconds (not the first repeats') are shared: a part may take what the parts before it left,
    less a floor kept for each part still to come, and never less than that floor; a measurement stops taking extra
    rounds once its part's share is spent."""
    import itertools
    import time

    from runner.config.schema import CalibrateSchema
    from runner.train.calibrate import FLOOR_SHARE, ExtraTime
    from runner.train.timing import timed

    c = CalibrateSchema(max_extra_s=40.0)
    extra = ExtraTime(c, 4)
    floor = 40.0 * FLOOR_SHARE
    first = extra.repeats()
    assert first.budget is not None and first.budget.until == pytest.approx(40.0 - 3 * floor)  # more than 10 s
    assert (first.least, first.most) == (c.repeats, c.max_repeats) and not first.out_of_time()
    extra.spent[0] = 39.0  # the first parts' extra rounds took nearly all of it
    assert first.out_of_time()  # ... so the first part takes no more
    third = (extra.repeats(), extra.repeats())[1]
    assert third.budget is not None and third.budget.until == pytest.approx(39.0 + floor)  # a floor kept
    assert not third.out_of_time()
    # timed() counts its extra rounds (not its first repeats) against the shared budget, and stops at its share
    small = ExtraTime(CalibrateSchema(max_extra_s=0.16, repeats=3, max_repeats=10_000, max_spread=0.01), 1)
    plan = small.repeats()
    times = itertools.cycle([0.3, 2.0, 3.4, 1.0, 3.0])  # ms: scattered, never known to 1%
    got = timed(lambda: time.sleep(next(times) / 1000), plan, lambda: None)
    assert len(got) > 3 and plan.out_of_time() and 0.16 <= small.spent[0] < 0.16 + 0.1


def test_a_calibration_s_values_are_checked_when_read(tmp_path: Path) -> None:
    cal = _calibration()
    good = save(cal, tmp_path / "good.calibration.yaml")

    def written(name: str, **constants: Any) -> Path:
        # a damaged value in a file the runner wrote (its digest remade, so only the value is wrong)
        bad = dataclasses.replace(cal, constants={**cal.constants, **constants})
        return save(bad, tmp_path / f"{name}{cal_mod.SUFFIX}")
    nan = written("nan", kernel_call_fwd_ms=float("nan"))
    with pytest.raises(ConfigError, match=r"its kernels constant kernel_call_fwd_ms=nan is not finite"):
        cal_mod.check_file(str(nan))
    negative = written("negative", intra_node_bandwidth=-5.0)
    line = str(pytest.raises(ConfigError, cal_mod.check_file, str(negative)).value)
    assert "\n" not in line and "intra_node_bandwidth=-5.0 is not a bandwidth in (0, 93132] GiB/s" in line
    assert "sharded" in cal_mod.value_faults({**cal.constants, "sharded": {"row_wise": {"fwd": {
        "fixed_ms": 1e9}}}})
    assert cal_mod.value_faults(cal.constants) == {}
    # under auto, a part whose value fails falls back alone, and the note names it
    folder = tmp_path / "auto"
    folder.mkdir()
    nan.rename(folder / f"20260601-000000-nan{cal_mod.SUFFIX}")
    chosen = for_job(cfg_for(f"cluster.calibration_dir={folder}").cluster, "cpu", True)
    assert chosen.calibration is not None and "kernel_call_fwd_ms=nan is not finite" in chosen.note
    assert "device_bw_gibps" not in chosen.calibration.constants and "collectives" in chosen.calibration.constants
    # edited after it was written, or made by an older runner: never reaches a plan
    text = good.read_text()
    edited = tmp_path / "edited.yaml"
    edited.write_text(text.replace("device_bw_gibps: ", "device_bw_gibps: 1", 1))
    assert "changed after it was written" in _refusal(edited)
    cut = tmp_path / "cut.yaml"
    cut.write_text(text[: len(text) // 2].rsplit("\n", 1)[0] + "\n")
    assert "cannot be used" in _refusal(cut)
    older = tmp_path / "older.yaml"
    older.write_text(yaml.safe_dump({**yaml.safe_load(text), "format": 1}))
    assert "made by an older runner" in _refusal(older)
    # auto passes over a file it cannot read, saying which and why
    (folder / f"20990101-000000-cut{cal_mod.SUFFIX}").write_text(cut.read_text())
    chosen = for_job(cfg_for(f"cluster.calibration_dir={folder}").cluster, "cpu", True)
    assert f"skipped 20990101-000000-cut{cal_mod.SUFFIX}:" in chosen.note and chosen.calibration is not None


def test_the_calibration_folder_is_checked_before_anything_is_measured(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    error, _ = precheck(["mode=calibrate", f"cluster.calibration_dir={afile}"])
    assert error is not None and "\n" not in error and "cluster.calibration_dir=" in error
    assert "is a file, not a folder" in error
    assert precheck(["mode=calibrate", f"cluster.calibration_dir={afile}", "calibrate.keep=false"])[0] is None
    assert precheck(["mode=calibrate", f"cluster.calibration_dir={tmp_path / 'new' / 'folder'}"])[0] is None


def test_bench_estimates_makes_its_folder_in_a_clone_without_outputs(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from estimates import work_folder

    work = work_folder(tmp_path)  # a fresh clone: no outputs/ yet
    assert work.is_dir() and work.parent == tmp_path / "outputs" and work.name.startswith("bench-estimates-")


def test_the_ranking_study_trains_each_plan_early_midway_and_late_and_none_twice_in_a_row() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from ranking import round_order

    for n, rounds in ((8, 3), (9, 3), (4, 3), (2, 3), (7, 5)):
        labels = [f"plan-{i}" for i in range(n)]
        order = [round_order(labels, r, rounds) for r in range(rounds)]
        assert all(sorted(o) == labels for o in order)  # every plan once a round
        assert all(a[-1] != b[0] for a, b in zip(order, order[1:], strict=False)), order  # no plan back to back
        if n >= rounds:  # each plan first in at most one round, last in at most one
            assert all(sum(o[0] == p for o in order) <= 1 and sum(o[-1] == p for o in order) <= 1 for p in labels)


def test_a_pinned_plan_is_rated_as_the_planner_rated_it(tmp_path: Path) -> None:
    import json

    from runner.config.tables import table_specs
    from runner.plan.analysis import per_rank_estimates
    from runner.plan.plan_file import plan_to_dict
    from runner.plan.planner import make_plan
    from runner.train.models import planning_model

    path = save(_calibration(), tmp_path / "c.yaml")
    for sharding in ("sharding=auto", "sharding=columnwise"):
        cfg = cfg_for("mode=plan", f"cluster.calibration={path}", sharding)
        planned: Dict[str, Any] = {}
        plan, best, _, _ = make_plan(plan_spec(cfg), planning_model(cfg), 2, 2, "cpu", facts=planned)
        pinned_file = tmp_path / f"{sharding.split('=')[1]}.json"
        pinned_file.write_text(json.dumps(plan_to_dict(plan, table_specs(cfg.model))))
        again: Dict[str, Any] = {}
        pin = cfg_for("mode=plan", f"cluster.calibration={path}", sharding, f"sharding.plan={pinned_file}")
        plan2, chosen, _, _ = make_plan(plan_spec(pin), planning_model(pin), 2, 2, "cpu", facts=again)
        assert plan_to_dict(plan2, table_specs(cfg.model)) == plan_to_dict(plan, table_specs(cfg.model))
        assert per_rank_estimates(chosen, 2) == per_rank_estimates(best, 2), sharding
        assert again["step"]["step_ms"] == pytest.approx(planned["step"]["step_ms"], rel=1e-12), sharding


def test_a_job_says_when_the_machine_runs_slower_than_when_it_was_calibrated(tmp_path: Path) -> None:
    """The calibration keeps its speed probe; a job that times its own finds how far the machine moved since, logs
    it, and says so beside the estimate (with the command that measures again) only past SPEED_SAID, either way."""
    import torch

    from runner.plan.cost.speed import SPEED_SAID
    from runner.plan.cost.step_estimate import step_metrics, step_text
    from runner.plan.planner import make_plan
    from runner.train.calibrate import speed_probe
    from runner.train.models import planning_model

    cal = _calibration()
    assert cal.constants["probe_ms"] == pytest.approx({"compute": 2.0, "memory": 4.0})
    probe = speed_probe(torch.device("cpu"), 3)
    assert set(probe) == {"compute", "memory"} and all(len(v) >= 3 and min(v) > 0 for v in probe.values())
    path = save(cal, tmp_path / "c.yaml")
    cfg = cfg_for(f"cluster.calibration={path}", "sharding=tablewise", "train.batch_size=64")
    dense = {"fwd_ms": 1.0, "bwd_ms": 2.0, "optimizer_ms": 0.1}
    said = {}
    for name, compute, memory in (("slow", 3.0, 6.4), ("same", 2.0 * (1 + SPEED_SAID) / 2, 4.0), ("fast", 1.7, 2.0),
                                  ("old", None, None)):
        facts: Dict[str, Any] = {}
        probes = {"probe_compute_ms": compute, "probe_memory_ms": memory} if compute else {}
        make_plan(plan_spec(cfg), planning_model(cfg), 2, 2, "cpu", facts=facts, dense_measured={**dense, **probes})
        step = facts["step"]
        said[name] = (step["speed_now"], step_text(step), step_metrics(step))
    speeds, text, metrics = said["slow"]
    assert speeds == pytest.approx({"compute": 1.5, "memory": 1.6})
    assert metrics["plan/speed_now/compute"] == pytest.approx(1.5)
    assert "1.50x the time of its compute probe" in text and "1.60x" in text and "mode=calibrate" in text
    assert "read low" in text and cal.made in text
    assert said["same"][0]["compute"] == pytest.approx((1 + SPEED_SAID) / 2) and "mode=calibrate" not in said["same"][1]
    assert "0.50x the time of its memory probe" in said["fast"][1] and "read high" in said["fast"][1]
    assert "compute probe" not in said["fast"][1]  # 0.85x: within SPEED_SAID either way
    assert said["old"][0] == {} and "plan/speed_now/compute" not in said["old"][2]


def test_the_job_s_own_dense_part_and_its_replicated_tables_enter_the_whole_step(tmp_path: Path) -> None:
    import torch

    from runner.plan.cost.step_estimate import replicated
    from runner.plan.planner import make_plan
    from runner.train.calibrate import job_dense_ms
    from runner.train.models import planning_model

    path = save(_calibration(), tmp_path / "c.yaml")
    cfg = cfg_for(f"cluster.calibration={path}", "sharding=dataparallel", "train.batch_size=64")
    from runner.data.layout import job_data
    from runner.data.pipeline import source
    from runner.train.models import build_model

    # timed on this worker at the job's batch
    data = next(iter(source(job_data(cfg), 0, 2, False, 0, 1)))
    measured = job_dense_ms(build_model(cfg, torch.device("cpu")), None, cfg.optimizer, data, 64, torch.device("cpu"))
    assert set(measured) == {"fwd_ms", "bwd_ms", "optimizer_ms"} and all(v > 0 for v in measured.values())
    fitted: Dict[str, Any] = {}
    plan, best, _, _ = make_plan(plan_spec(cfg), planning_model(cfg), 2, 2, "cpu", facts=fitted)
    timed: Dict[str, Any] = {}
    plan2, _, _, _ = make_plan(plan_spec(cfg), planning_model(cfg), 2, 2, "cpu", facts=timed, dense_measured=measured)
    assert plan2 == plan  # the plan never depends on it
    parts, c = timed["step"]["parts"], _calibration().constants
    assert parts["dense_forward"] == measured["fwd_ms"] and parts["dense_backward"] == measured["bwd_ms"]
    assert timed["step"]["dense_measured"] and not fitted["step"]["dense_measured"]
    # the data-parallel tables are updated by the dense optimizer on every rank: their parameters count
    tables = replicated(best, 2)
    from runner.config.tables import table_specs
    from runner.plan.analysis import per_rank_estimates
    from runner.plan.cost.step_estimate import allreduce_ms, dense_facts, optimizer_added_ms

    assert tables.params == sum(t.num_embeddings * t.embedding_dim for t in table_specs(cfg.model)) > 0
    assert tables.bytes == 4 * tables.params
    dense_params = dense_facts(planning_model(cfg), 64).params
    assert parts["optimizer"] == pytest.approx(measured["optimizer_ms"]
                                               + optimizer_added_ms(c, dense_params / 1e6, tables.params / 1e6))
    assert optimizer_added_ms(c, dense_params / 1e6, tables.params / 1e6) > 0
    # ... and DDP all-reduces their gradients in the dense part's buckets: TorchRec's own all-reduce and optimizer
    # kernels of each table are taken out of its total, so neither is counted twice
    torchrec = per_rank_estimates(best, 2)[0]
    assert tables.dropped(0) == pytest.approx(torchrec["bwd_comms_ms"]) and tables.dropped(0) > 0
    assert parts["embeddings"] == pytest.approx(torchrec["total_ms"] - torchrec["bwd_comms_ms"], abs=0.5)
    dense_bytes = dense_facts(planning_model(cfg), 64).bytes
    reduce = c["collectives"]["all_reduce"]["intra"]
    assert parts["dense_allreduce"] == pytest.approx(allreduce_ms(reduce, dense_bytes + tables.bytes))
    assert parts["dense_allreduce"] > allreduce_ms(reduce, dense_bytes) + tables.bytes / (reduce["bandwidth_gibps"]
                                                                                          * 1024**3 / 1000.0) * 0.99
    # the plan's rating counts the same: its embeddings without TorchRec's term, the tables' update and all-reduce
    from runner.plan.cost.step_estimate import StepPerfModel

    rated = StepPerfModel(_calibration(), 2, 2, 64).rate(best)
    assert rated == pytest.approx(parts["embeddings"] + parts["sharded_lookups"] + parts["dense_allreduce"]
                                  - allreduce_ms(reduce, dense_bytes)
                                  + optimizer_added_ms(c, 0.0, tables.params / 1e6))
    from runner.plan.cost.step_estimate import step_text

    assert "the dense part measured on this job's model" in step_text(timed["step"])


def test_a_calibration_learns_its_step_overhead_and_compute_wait_from_runs(tmp_path: Path) -> None:
    import json

    from runner.plan.cost import learn

    folder = tmp_path / "cals"
    measured = _calibration()
    measured.constants["step_overhead"] = {"fixed_ms": 0.5, "ms_per_unit": 0.8, "ms_per_ksample": 0.8, "fit_error": 0.0}
    cal = load_calibration(save(measured, folder / f"20260101-000000-mine{cal_mod.SUFFIX}"))
    per_ksample = 0.8  # the tiny-table job's overhead per 1,000 samples, kept as measured
    runs = tmp_path / "runs"
    truth = (1.5, 0.25, 0.05)  # what the runs took beyond their parts: ms, share of their compute, ms per table
    for i, (batch, tables) in enumerate([(256, 6), (1024, 6), (512, 20), (2048, 40), (256, 300), (4096, 10)]):
        run = runs / f"run{i}"
        (run / "plan").mkdir(parents=True)
        dense = 2.0 + batch / 100.0 + (7.0 if i % 2 else 0.0)  # compute not in proportion to the batch
        parts = 10.0 + dense  # every estimated part of the slowest rank but the overhead and the wait
        extra = truth[0] + truth[1] * dense + truth[2] * tables + per_ksample * batch / 1000.0
        part = {"step_ms": parts + 0.2, "step_overhead": 0.2, "dense_forward": dense, "dense_backward": 0.0,
                "optimizer": 0.0, "rank_wait": 0.0}
        est = {"calibration": cal.path, "step": {"per_rank": [part] * 2}}
        (run / "plan" / "estimates.json").write_text(json.dumps(est))
        (run / "measured.json").write_text(json.dumps({"per_rank": [{"step_ms": parts + extra - 0.1},
                                                                     {"step_ms": parts + extra}]}))
        (run / "resolved.yaml").write_text(yaml.safe_dump({"train": {"batch_size": batch}}))
        (run / "plan" / "plan.json").write_text(json.dumps({"m": {f"t{k}": {} for k in range(tables)}}))
    (runs / "other").mkdir()  # a run planned with another machine's calibration is not this hardware's evidence
    no_wait = dataclasses.replace(cal, constants={**cal.constants, "rank_wait": {"factor": 1.0, "per_call_ms": 0.0}})
    points = learn.run_points(learn.runs_under(runs), no_wait)
    assert len(points) == 6
    learned = learn.refit(no_wait, points, str(runs)).constants
    fit, wait = learned["step_overhead"], learned["rank_wait"]
    assert (fit["fixed_ms"], wait["factor"] - 1.0, fit["per_table_ms"]) == pytest.approx(truth, rel=1e-6)
    assert fit["ms_per_ksample"] == per_ksample and fit["fit_error"] < 1e-9 and wait["measured_factor"] == 1.0
    assert learn.overhead_ms(learned, 512, 20) == pytest.approx(1.5 + per_ksample * 0.512 + 0.05 * 20)
    assert all(learn.estimate_ms(learned, p) == pytest.approx(p["measured_ms"]) for p in points)
    # the command writes it beside the calibration it refined; auto takes it (the newest) and says it learned
    assert learn.learn_command([str(runs), str(cal.path)]) == 0
    chosen = for_job(cfg_for(f"cluster.calibration_dir={folder}").cluster, "cpu", True).calibration
    assert chosen is not None and chosen.learned["runs"] == 6 and chosen.path != cal.path
    assert chosen.constants["rank_wait"]["factor"] > 1.0
    assert chosen.learned["held_out_error"] < 1e-6 < chosen.learned["measured_error"]
    assert learn.learn_command([str(tmp_path / "empty")]) == 2
    # runs the calibration as measured already estimates but for their noise: a refit follows the noise, estimates
    # the run it left out worse, and is not taken (nothing written)
    noisy = tmp_path / "noisy"
    for i, p in enumerate(points):
        run = noisy / f"run{i}"
        shutil.copytree(runs / f"run{i}", run)
        step = learn.estimate_ms(no_wait.constants, p) * (1.0 + (0.2, -0.15, 0.1, -0.25, 0.05, -0.05)[i])
        (run / "measured.json").write_text(json.dumps({"per_rank": [{"step_ms": step}] * 2}))
    noise = learn.run_points(learn.runs_under(noisy), no_wait)
    errors = learn.held_out_errors(no_wait, noise)
    assert sorted(map(abs, errors["measured"])) == pytest.approx(sorted(abs(1 / (1 + e) - 1) for e in (
        0.2, -0.15, 0.1, -0.25, 0.05, -0.05)))
    kept, line = learn.choose(no_wait, noise, str(noisy))
    assert kept is None and line.startswith("kept as measured: ") and "%" in line, line
    before = sorted(folder.iterdir())
    assert learn.learn_command([str(noisy), str(cal.path)]) == 0 and sorted(folder.iterdir()) == before
    # runs on both sides whose left-out run a refit estimates better all the same (4 far high, 2 near low): no bias
    # beyond chance, so nothing is learned; all 6 high (a term the calibration lacks keeps its side): learned
    for shift, taken in (((0.3, 0.3, 0.3, 0.3, -0.01, -0.01), False), ((0.3, 0.25, 0.3, 0.2, 0.01, 0.02), True)):
        leaning = [{**p, "measured_ms": learn.estimate_ms(no_wait.constants, p) / (1.0 + shift[i])}
                   for i, p in enumerate(points)]
        errors = learn.held_out_errors(no_wait, leaning)
        assert statistics.median(map(abs, errors["refitted"])) < statistics.median(map(abs, errors["measured"]))
        chosen, line = learn.choose(no_wait, leaning, "shifted")
        assert (chosen is not None) == taken and ("no bias to learn" in line) != taken, line
        assert f"the runs {sum(e < 0 for e in shift)} low, {sum(e > 0 for e in shift)} high" in line, line


def test_learning_from_runs_charges_a_run_s_compute_wait_by_the_calibration_it_refits(tmp_path: Path) -> None:
    import json

    from runner.plan.cost import learn

    cal = load_calibration(save(_calibration(), tmp_path / "c.yaml"))
    waiting = dataclasses.replace(cal, constants={**cal.constants, "rank_wait": {"factor": 1.5, "per_call_ms": 1.0}})
    run = tmp_path / "runs" / "run0"
    (run / "plan").mkdir(parents=True)
    # planned with a wait of 1.4 ms on its 14 ms of compute (dense 4 + 6, optimizer 1, kernels 1 + 2)
    part = {"step_ms": 30.0, "step_overhead": 2.0, "dense_forward": 4.0, "dense_backward": 6.0, "optimizer": 1.0,
            "rank_wait": 1.4}
    est = {"calibration": cal.path, "step": {"per_rank": [part] * 2},
           "per_rank": [{"fwd_compute_ms": 1.0, "bwd_compute_ms": 2.0}] * 2}
    (run / "plan" / "estimates.json").write_text(json.dumps(est))
    (run / "measured.json").write_text(json.dumps({"per_rank": [{"step_ms": 40.0}, {"step_ms": 39.0}]}))
    (run / "resolved.yaml").write_text(yaml.safe_dump({"train": {"batch_size": 256}}))
    (run / "plan" / "plan.json").write_text(json.dumps({"m": {"t0": {}}}))
    [point] = learn.run_points([run], waiting)
    assert point["compute_ms"] == pytest.approx(14.0) and point["wait_ms"] == pytest.approx(7.0)
    assert point["parts_ms"] == pytest.approx(30.0 - 2.0 - 1.4 + 7.0)  # the refit is of what is left beyond it
    assert learn.estimate_ms(cal.constants, point) == pytest.approx(
        30.0 - 2.0 - 1.4 + learn.overhead_ms(cal.constants, 256, 1))  # a calibration without the wait: none


def test_a_calibration_missing_a_collective_of_its_world_is_damaged(tmp_path: Path) -> None:
    cal = _calibration()  # 1 x 2: every collective within the node
    del cal.constants["collectives"]["all_to_all"]["intra"]
    path = save(cal, tmp_path / "x.calibration.yaml")  # written whole (its digest matches): still not a calibration
    assert "it is damaged (no collectives.all_to_all.intra)" in _refusal(path)


def test_the_step_overhead_is_fitted_over_every_batch_timed_with_the_dense_part_measured_there() -> None:
    # the tiny-table job's step at a quarter, 1x and 4x the job's batch: its parts (the dense part as measured at
    # each batch, which at 4x is twice its fit: a model's dense part does not follow the square layers' rate) plus
    # an overhead of 2 ms + 5 ms per 1,000 samples, which the fit recovers
    from runner.plan.cost.fit import _parts_ms, step_overhead
    from runner.train.calibrate import step_batches

    measured = _measured()
    constants, _, _ = fit_all(measured)
    job = {"batch": 256, "world": 2, "device": "cpu", "pooling": 1, "layers": [], "other_params": 0, "dims": [64] * 6}
    batches = step_batches(256, "full")
    assert batches == [64, 256, 1024] and step_batches(256, "small") == [64, 256]
    fitted = _parts_ms(constants, job, measured["params"], 1024)
    measured["dense"][1024] = {"fwd": [[fitted]] * 2, "bwd": [[fitted]] * 2, "optimizer": [[0.15]] * 2}
    measured.update(job=job, step={b: [[_parts_ms(constants, job, measured["params"], b, measured["dense"].get(b))
                                        + 2.0 + 5.0 * b / 1000.0]] * 2 for b in batches})
    fit = step_overhead(constants, measured)
    assert fit["fixed_ms"] == pytest.approx(2.0, rel=1e-6) and fit["ms_per_ksample"] == pytest.approx(5.0, rel=1e-6)
    assert fit["fit_error"] == pytest.approx(0.0, abs=1e-9)
    # the dense part by its fit at 4x (what the overhead took before): the 4x point's dense time lands in the overhead
    measured["dense"].pop(1024)
    assert step_overhead(constants, measured)["ms_per_ksample"] > 5.5


def test_each_family_s_tiny_job_gives_that_family_its_own_overhead_beyond_the_machine_s_drift() -> None:
    # the tiny-table job timed table-wise at two batches and in every family at the job's in 6 interleaved rounds:
    # 2 ms + 5 ms per 1,000 samples beyond its parts for every family, 12 ms more for table-wise (as at 2 x 2) and
    # 1 ms more for data-parallel, every round slower or faster by up to 30% for all families alike (the machine's
    # drift) and each step off by up to +-0.3 ms of its own; each family's extra over the cheapest is its own, a
    # difference within the noise counts as 0, and the fit is of the rest
    from runner.plan.cost.fit import _parts_ms, family_overhead, step_overhead
    from runner.plan.cost.step_estimate import family_overhead_ms

    measured = _measured()
    constants, _, _ = fit_all(measured)
    job = {"batch": 256, "world": 2, "device": "cpu", "pooling": 1, "layers": [], "other_params": 0, "dims": [64] * 6}
    extra = {"table_wise": 12.0, "row_wise": 0.0, "data_parallel": 1.0}
    rnd = random.Random(3)
    drift = [1 + rnd.uniform(-0.3, 0.3) for _ in range(6)]

    def step(b: int, kind: str, scale: float = 1.0) -> float:
        return (_parts_ms(constants, job, measured["params"], b, measured["dense"].get(b), kind) + 2.0
                + 5.0 * b / 1000.0 + extra[kind]) * scale
    measured.update(job=job, step={b: [[step(b, "table_wise")]] * 2 for b in (64, 256)},
                    step_family={k: [[step(256, k, d) + rnd.uniform(-0.3, 0.3) for d in drift]] * 2 for k in extra})
    fit = step_overhead(constants, measured)
    assert fit["family_ms"] == pytest.approx(extra, abs=0.8)
    assert fit["fixed_ms"] == pytest.approx(2.0, abs=0.8) and fit["ms_per_ksample"] == pytest.approx(5.0, rel=0.2)
    c = {"step_overhead": fit}
    assert family_overhead_ms(c, [("row_wise", 6)]) == pytest.approx(0.0, abs=1e-6)
    assert family_overhead_ms(c, [("column_wise", 2), ("table_wise", 4)]) == pytest.approx(fit["family_ms"][
        "table_wise"])  # one family
    assert family_overhead_ms(c, [("table_wise", 4), ("data_parallel", 2)]) == pytest.approx(
        fit["family_ms"]["table_wise"] + fit["family_ms"]["data_parallel"])
    assert family_overhead_ms({"step_overhead": {"fixed_ms": 1.0}}, [("table_wise", 4)]) == 0.0  # not timed
    # the same families' rounds timed one after another, not interleaved (the drift unpaired): the differences
    # scatter by the drift, and none is told from table-wise's
    family, noise = family_overhead({"table_wise": [20.0, 31.0, 25.0, 19.0], "row_wise": [12.0, 30.0, 9.0, 16.0],
                                     "data_parallel": [24.0, 35.0, 17.0, 22.0]})
    assert family == {"table_wise": 0.0, "row_wise": 0.0, "data_parallel": 0.0} and noise["row_wise"] > 2.0
    # a family whose step came out under its parts (data-parallel, -10 ms, as at 2 x 2) pays nothing and raises no
    # other family's term: table-wise pays its own 14 ms, row-wise its 0
    family, _ = family_overhead({"table_wise": [14.2, 13.8, 14.1, 13.9], "row_wise": [0.1, -0.2, 0.2, -0.1],
                                 "data_parallel": [-9.8, -10.3, -10.1, -9.9]})
    assert family == pytest.approx({"table_wise": 14.0, "row_wise": 0.0, "data_parallel": 0.0}, abs=0.2)
    # two rounds are too few to tell anything
    assert family_overhead({"table_wise": [20.0, 21.0], "row_wise": [5.0, 6.0]})[0] == {"table_wise": 0.0,
                                                                                         "row_wise": 0.0}


def test_a_batch_whose_parts_reach_its_step_does_not_pull_the_overhead_to_zero() -> None:
    # the tiny-table job 4.1 and 4.7 ms beyond its parts at 64 and 256 samples and 0.5 ms below them at 1,024 (a
    # calibration of 2026-11-29): weighed relative to the step, the overhead is the other batches' few ms, not the
    # 0.001 ms a fit relative to the residual itself gave
    from runner.plan.cost.fit import fit_overhead

    points = [{"batch": 64, "tables": 6, "measured_ms": 14.6, "parts_ms": 10.5},
              {"batch": 256, "tables": 6, "measured_ms": 18.5, "parts_ms": 13.8},
              {"batch": 1024, "tables": 6, "measured_ms": 29.3, "parts_ms": 29.8}]
    fit = fit_overhead(points)
    assert 3.0 < fit["fixed_ms"] < 4.5 and fit["ms_per_ksample"] == 0.0 and "per_table_ms" not in fit
    assert fit["fit_error"] == pytest.approx(max(abs(p["parts_ms"] + fit["fixed_ms"] - p["measured_ms"])
                                                 / p["measured_ms"] for p in points))


def test_the_dense_optimizer_is_read_between_the_sizes_timed() -> None:
    """Its time per parameter grows past the caches (2 x 2 here: 2.8 ms per M at 4.2 M, a line through all sizes
    1.5): between two sizes timed, on their line; past the largest, on the last two's; a file without sizes, its
    fit."""
    from runner.plan.cost.step_estimate import optimizer_added_ms, optimizer_ms

    sizes = {29377: 0.09, 470032: 0.57, 4194304: 11.86, 16777216: 33.08}
    c = {"optimizer": {"fixed_ms": 0.04, "ms_per_unit": 1.54, "measured_ms": sizes}}
    for n, ms in sizes.items():
        assert optimizer_ms(c, n / 1e6) == pytest.approx(ms)
    middle = optimizer_ms(c, 10.0)
    assert middle == pytest.approx(11.86 + (33.08 - 11.86) / (16.777216 - 4.194304) * (10.0 - 4.194304))
    assert middle > 0.04 + 1.54 * 10.0  # the line through every size: a quarter under
    assert optimizer_ms(c, 30.0) == pytest.approx(33.08 + (33.08 - 11.86) / (16.777216 - 4.194304) * (30 - 16.777216))
    assert optimizer_ms(c, 0.0) == 0.0 or optimizer_ms(c, 0.0) < 0.09  # below the smallest: the first two's line
    assert optimizer_added_ms(c, 0.47, 12.0) == pytest.approx(optimizer_ms(c, 12.47) - optimizer_ms(c, 0.47))
    assert optimizer_added_ms(c, 0.47, 0.0) == 0.0
    assert optimizer_ms({"optimizer": {"fixed_ms": 0.04, "ms_per_unit": 1.54}}, 10.0) == pytest.approx(15.44)


def test_ddp_s_all_reduce_over_the_world_is_scaled_from_the_group_that_was_measured() -> None:
    from runner.plan.cost.step_estimate import allreduce_ms, ddp_allreduce

    intra, cross = {"latency_ms": 1.0, "bandwidth_gibps": 2.0}, {"latency_ms": 2.0, "bandwidth_gibps": 1.0}
    c = {"collectives": {"all_reduce": {"intra": intra, "cross": cross}}}
    assert ddp_allreduce(c, 2, 2) == intra  # one node of 2: the group measured is the world
    assert ddp_allreduce(c, 1, 1)["bandwidth_gibps"] > 0  # one rank: nothing to reduce, nothing scaled
    # 2 nodes x 2: measured across nodes in pairs; a ring of 4 takes 3 steps for 1, and each rank moves 1.5x the bytes
    four = ddp_allreduce(c, 4, 2)
    assert four["latency_ms"] == pytest.approx(3 * cross["latency_ms"])
    assert four["bandwidth_gibps"] == pytest.approx(cross["bandwidth_gibps"] / 1.5)
    mib = 2**20
    assert allreduce_ms(four, 48 * mib) == pytest.approx(6.0 + 1.5 * 48 * mib / (1.0 * 2**30) * 1000)
    # one node of 4 measured as 4: as measured; without a cross fit, the node's, scaled from its 2 ranks to 8
    assert ddp_allreduce(c, 4, 4) == intra
    only_intra = {"collectives": {"all_reduce": {"intra": intra}}}
    assert ddp_allreduce(only_intra, 8, 2)["latency_ms"] == pytest.approx(7 * intra["latency_ms"])
    # no measured all-reduce: TorchRec's bandwidth for the scope, no latency
    assert ddp_allreduce({"collectives": {}}, 4, 2) == {"latency_ms": 0.0, "bandwidth_gibps": 12.5}
    # several nodes of several workers: the calibration measures the all-reduce over every worker too, and DDP's is
    # that one, as measured (the pairs' scaled figure put a 2-node data-parallel step at 137 ms of its 193)
    from runner.train.calibrate import WORLD_SCOPE, scopes

    world = {"latency_ms": 9.0, "bandwidth_gibps": 0.3}
    measured = {"collectives": {"all_reduce": {"intra": intra, "cross": cross, "world": world}}}
    assert ddp_allreduce(measured, 4, 2) == world and ddp_allreduce(measured, 2, 2) == intra
    assert scopes(4, 2) == {"intra": [[0, 1], [2, 3]], "cross": [[0, 2], [1, 3]], "world": [[0, 1, 2, 3]]}
    assert "world" not in scopes(2, 2) and "world" not in scopes(2, 1) and WORLD_SCOPE == ("all_reduce",)
    # TorchRec is given its two scopes only (its own terms scale a group's bandwidth to the world)
    from runner.plan.cost.calibration import Calibration
    from runner.plan.cost.topology import measured_comms

    cal = Calibration({}, {"collectives": {"all_reduce": {"intra": intra, "cross": cross, "world": world}}}, {}, {})
    assert set(measured_comms(cal, None, None)["all_reduce"]) == {"intra", "cross"}


def test_each_sharding_type_of_a_collection_is_a_sharded_lookup_of_its_own(tmp_path: Path) -> None:
    # TorchRec's sharded collection runs one lookup (input and output distributions) per sharding type it holds:
    # the largest table column-wise beside table-wise ones pays the table-wise family's fixed cost twice
    from runner.plan.cost.step_estimate import StepPerfModel, lookups_ms, sharded_lookups
    from runner.plan.planner import make_plan
    from runner.train.models import planning_model

    path = save(_calibration(), tmp_path / "c.yaml")
    plans = {}
    rest = [f"+sharding.constraints.t{i}.sharding_types=[table_wise]" for i in range(1, 6)]
    for label, overrides in (("tw", ["sharding=tablewise"]),
                             ("cw", ["sharding=auto", "+sharding.constraints.t0.sharding_types=[column_wise]", *rest])):
        cfg = cfg_for("mode=plan", f"cluster.calibration={path}", "train.batch_size=64", *overrides)
        facts: Dict[str, Any] = {}
        _, best, _, _ = make_plan(plan_spec(cfg), planning_model(cfg), 2, 2, "cpu", facts=facts)
        plans[label] = (best, facts["step"])
    tw, cw = sharded_lookups(plans["tw"][0]), sharded_lookups(plans["cw"][0])
    assert [k for k, _ in tw] == ["table_wise"] and sorted(k for k, _ in cw) == ["column_wise", "table_wise"]
    assert sum(n for _, n in cw) == sum(n for _, n in tw) == 6
    c = _calibration().constants
    fit = c["sharded"]["table_wise"]
    twice = lookups_ms(c, cw, 64)["fwd"] - lookups_ms(c, tw, 64)["fwd"]
    assert twice == pytest.approx(fit["fwd"]["fixed_ms"]) and twice > 0
    assert plans["cw"][1]["parts"]["sharded_lookups"] > plans["tw"][1]["parts"]["sharded_lookups"]
    model = StepPerfModel(_calibration(), 2, 2, 64)
    assert model.rate(plans["cw"][0]) - model.rate(plans["tw"][0]) >= twice + fit["bwd"]["fixed_ms"] - 1.0


def test_the_step_s_compute_waits_for_the_slowest_rank_by_the_factor_measured_in_lockstep(tmp_path: Path) -> None:
    from runner.plan.analysis import per_rank_estimates
    from runner.plan.cost.fit import rank_wait
    from runner.plan.cost.step_estimate import StepPerfModel
    from runner.plan.planner import make_plan
    from runner.train.models import planning_model

    # two ranks, three rounds of 20 calls at two batches: each rank's own times and each call's slowest rank; a
    # call's wait is 2 ms + 10% of the ranks' median
    def rounds(ms: float) -> Dict[str, Any]:
        own = [[[ms] * 20 for _ in range(3)] for _ in range(2)]
        return {"own": own, "slowest": [[[ms + 2.0 + 0.1 * ms] * 20] * 3] * 2}
    got = rank_wait({64: rounds(10.0), 256: rounds(40.0)})
    assert got["factor"] == pytest.approx(1.1) and got["per_call_ms"] == pytest.approx(2.0)
    # ranks whose speed jitters by +-20% call by call (60 calls a round): the later of two waits in proportion to
    # the call (within the bounds below for seeds 0-39)
    rnd = random.Random(3)

    def jitter(ms: float) -> Dict[str, Any]:
        own = [[[ms * (1 + rnd.uniform(-0.2, 0.2)) for _ in range(60)] for _ in range(3)] for _ in range(2)]
        worst = [[max(a, b) for a, b in zip(own[0][i], own[1][i], strict=True)] for i in range(3)]
        return {"own": own, "slowest": [worst, worst]}
    jittery = rank_wait({64: jitter(10.0), 256: jitter(40.0)})
    assert 1.03 < jittery["factor"] < 1.2 and jittery["per_call_ms"] < 0.5
    faster = {b: {**r, "slowest": [[[ms - 1.0] * 20] * 3] * 2} for (b, r), ms in zip(
        {64: rounds(10.0), 256: rounds(40.0)}.items(), (10.0, 40.0), strict=True)}
    assert rank_wait(faster)["factor"] == 1.0  # never below its parts
    # fitted with the rest, the whole step pays it on its compute and the rating on the plan's kernels
    constants, spreads, errors = fit_all({**_measured(), "lockstep": {64: rounds(10.0), 256: rounds(40.0)}})
    assert constants["rank_wait"]["factor"] == pytest.approx(1.1)
    waiting = Calibration(fingerprint("cpu", 1, 2), constants, spreads, {p: True for p in cost_fit.PARTS}, {},
                          "2026-11-27T00:00:00Z", errors)
    steps = {}
    for name, cal in (("waiting", waiting), ("none", _calibration())):
        cfg = cfg_for(f"cluster.calibration={save(cal, tmp_path / f'{name}.yaml')}", "sharding=tablewise",
                      "train.batch_size=64")
        facts: Dict[str, Any] = {}
        _, best, _, _ = make_plan(plan_spec(cfg), planning_model(cfg), 2, 2, "cpu", facts=facts)
        steps[name] = (facts["step"], best)
    step, best = steps["waiting"]
    parts, rank = step["parts"], step["critical_rank"]
    kernels = per_rank_estimates(best, 2)[rank]
    assert parts["rank_wait"] == pytest.approx(0.1 * (parts["dense_forward"] + parts["dense_backward"]
                                                      + parts["optimizer"] + kernels["fwd_compute_ms"]
                                                      + kernels["bwd_compute_ms"])) and parts["rank_wait"] > 0
    assert steps["none"][0]["parts"]["rank_wait"] == 0.0  # a calibration without the lockstep: no term
    # the same plan rated by both: the waiting one more by a tenth of a rank's kernels (the busiest's, or another's)
    k = [r["fwd_compute_ms"] + r["bwd_compute_ms"] for r in per_rank_estimates(best, 2)]
    more = StepPerfModel(waiting, 2, 2, 64).rate(best) - StepPerfModel(_calibration(), 2, 2, 64).rate(best)
    assert 0.1 * min(k) - 1e-9 <= more <= 0.1 * max(k) + 1e-9 and min(k) > 0


def _tablewise_plans(cal: Calibration, tmp_path: Path, rows: Dict[str, int], per_rank: Any) -> Dict[str, Any]:
    """DLRM's six tables, each of ``rows[label]`` rows, planned table-wise on 1 x 2 with ``cal``: per label the plan,
    its whole step and ``per_rank(constants, plan, 2)``."""
    from runner.plan.planner import make_plan
    from runner.train.models import planning_model

    path = save(cal, tmp_path / "c.yaml")
    got = {}
    for label, n in rows.items():
        tables = [f"model.tables.{i}.num_embeddings={n}" for i in range(6)]
        cfg = cfg_for("mode=plan", f"cluster.calibration={path}", "train.batch_size=512", "sharding=tablewise",
                      *tables)
        facts: Dict[str, Any] = {}
        _, best, _, _ = make_plan(plan_spec(cfg), planning_model(cfg), 2, 2, "cpu", facts=facts)
        got[label] = (best, facts["step"], per_rank(cal.constants, best, 2))
    return got


def test_the_backward_paid_per_distinct_row_is_read_off_and_saved_where_a_step_s_ids_repeat_rows(
        tmp_path: Path) -> None:
    # the fused backward updates each row a step's ids reach once: over 256 rows, 16,384 ids cost a fraction of what
    # they cost over 200,000; the fit reads the share, and a plan's tables smaller than their ids save it
    import dataclasses

    from runner.plan.cost.fit import fit_kernels
    from runner.plan.cost.row_reuse import repeated_share, row_reuse_ms
    from runner.plan.cost.step_estimate import StepPerfModel

    per_byte, share, multiplier = 1000.0 / (12.0 * GIB), 0.6, 9.0
    shapes = [(r, d, p, b) for r in (20_000, 200_000) for d in (16, 64, 256) for p in (1, 8) for b in (256, 2048)]
    shapes += [(256, d, 8, b) for d in (16, 64, 256) for b in (256, 2048)]
    points = [{"rows": r, "dim": d, "pooling": p, "batch": b, "fwd_ms": 0.1 + kernel_bytes(b, p, d) * per_byte,
               "bwd_ms": 0.05 + multiplier * kernel_bytes(b, p, d) * per_byte
               * (1 - share * repeated_share(r, b * p))} for r, d, p, b in shapes]
    fit = fit_kernels(points)
    assert fit["device_bw_gibps"] == pytest.approx(12.0, rel=0.02)
    assert fit["bwd_row_share"] == pytest.approx(share, abs=0.02)
    assert fit["bwd_compute_multiplier"] == pytest.approx(multiplier, rel=0.02)
    assert fit["fit_error_bwd"] < 0.02
    # without a table the ids repeat, no share to read off: TorchRec's per-id model
    assert fit_kernels([p for p in points if p["rows"] > 256])["bwd_row_share"] == 0.0

    base = _calibration()
    cal = dataclasses.replace(base, constants={**base.constants, "bwd_row_share": share})
    got = _tablewise_plans(cal, tmp_path, {"tiny": 100, "large": 10_000_000}, row_reuse_ms)
    best, step, reused = got["tiny"]
    bwd = [sum(s.perf.bwd_compute for o in best for s in o.shards if s.rank == r) for r in range(2)]
    # 100 rows, 1,024 ids a step each: nearly every id repeats a row
    assert all(-share * b <= x < -0.85 * share * b for x, b in zip(reused, bwd, strict=True))
    assert step["parts"]["row_reuse"] == pytest.approx(reused[step["critical_rank"]])
    assert all(abs(x) < 1e-3 * share * b for x, b in zip(got["large"][2], bwd, strict=True))
    assert got["large"][1]["parts"]["row_reuse"] == pytest.approx(0.0, abs=1e-3)
    # the plans' rating counts it as the whole step does
    plain = StepPerfModel(base, 2, 2, 512)
    assert StepPerfModel(cal, 2, 2, 512).rate(best) < plain.rate(best) + 0.5 * min(reused)


def test_the_kernel_s_cost_by_its_tables_bytes_is_read_off_and_paid_by_the_rank_that_holds_them(
        tmp_path: Path) -> None:
    # a step's new ids find fewer of their rows in the caches as the tables grow: made with a known multiple (flat to
    # 8 MiB, then +40% forward and +20% backward per doubling), each shape's times also off TorchRec's bytes by a
    # factor of its own (what its bandwidth term misses, which the fit must not read as a size's)
    from runner.plan.cost.fit import fit_kernels
    from runner.plan.cost.step_estimate import StepPerfModel
    from runner.plan.cost.table_size import doublings, multiple, table_size_ms
    from runner.train.calibrate import kernel_shapes

    per_byte, level, start, growth = 1000.0 / (12.0 * GIB), {"fwd": 0.7, "bwd": 0.8}, 8.0, {"fwd": 0.4, "bwd": 0.2}
    shapes = [s for s in kernel_shapes("full") if s["rows"] > 256]
    assert max(s["rows"] * s["dim"] * 4 for s in shapes) > 400 * 2**20  # the grid reaches past the caches
    rng = random.Random(3)
    own = {(s["dim"], s["pooling"], s["batch"]): rng.uniform(0.8, 1.25) for s in shapes}

    def took(s: Dict[str, int], part: str) -> float:
        size = level[part] * (1 + growth[part] * doublings(s["rows"] * s["dim"] * 4, start))
        term = kernel_bytes(s["batch"], s["pooling"], s["dim"]) * per_byte * (9.0 if part == "bwd" else 1.0)
        return 0.05 + term * size * own[(s["dim"], s["pooling"], s["batch"])]
    fit = fit_kernels([{**s, "fwd_ms": took(s, "fwd"), "bwd_ms": took(s, "bwd")} for s in shapes])["table_size"]
    for part in ("fwd", "bwd"):
        assert fit[part]["from_mib"] == pytest.approx(start, rel=0.2)
        assert fit[part]["per_doubling"] == pytest.approx(growth[part], abs=0.03)
        big, small = multiple(fit, part, 488 * 2**20), multiple(fit, part, 2**20)
        assert big / small == pytest.approx(1 + growth[part] * doublings(488 * 2**20, start), rel=0.05)
    # a grid of one table size has nothing to read it from: no term
    assert "table_size" not in fit_kernels([{**s, "fwd_ms": 1.0 + s["batch"] * 1e-4, "bwd_ms": 2.0 + s["batch"] * 1e-4}
                                            for s in shapes if s["rows"] == 20_000])

    base = _calibration()
    cal = dataclasses.replace(base, constants={**base.constants, "table_size": fit})
    got = _tablewise_plans(cal, tmp_path, {"small": 1000, "large": 4_000_000}, table_size_ms)
    for label, sign in (("small", -1), ("large", 1)):
        best, step, sized = got[label]
        compute = [sum(s.perf.fwd_compute + s.perf.bwd_compute for o in best for s in o.shards if s.rank == r)
                   for r in range(2)]
        # small tables run faster than the calibration's mean rate, a rank's 500 MiB of tables slower
        assert all(sign * sum(x) > 0.1 * c for x, c in zip(sized, compute, strict=True)), (label, sized, compute)
        assert step["parts"]["table_size"] == pytest.approx(sum(sized[step["critical_rank"]]))
    # the plans' rating counts it as the whole step does
    best = got["large"][0]
    assert StepPerfModel(cal, 2, 2, 512).rate(best) > StepPerfModel(base, 2, 2, 512).rate(best) + 0.5 * max(
        sum(x) for x in got["large"][2])
    # a damaged multiple is refused when read
    assert cal_mod.value_faults({"table_size": {**fit, "fwd": {**fit["fwd"], "level": 0}}}) == {
        "kernels": "table_size.fwd.level=0 is not a positive number up to 1e+06"}


def test_the_output_charge_the_sharded_lookups_fit_takes_off_is_torchrec_s_own(tmp_path: Path) -> None:
    # what the calibration takes off its tiny sharded lookups for their pooled output is what TorchRec's estimate
    # charges a plan's shard of that family: row-wise a reduce-scatter forward and an all-gather (and a copy)
    # backward of the whole batch's output on every rank, table-wise an all-to-all on the table's rank
    from runner.plan.cost.fit import output_ms
    from runner.plan.planner import make_plan
    from runner.train.models import planning_model

    cal = _calibration()
    c, path = cal.constants, save(cal, tmp_path / "c.yaml")
    for sharding, kind, share in (("rowwise", "row_wise", 1), ("tablewise", "table_wise", 2)):
        cfg = cfg_for("mode=plan", f"cluster.calibration={path}", "train.batch_size=512", f"sharding={sharding}")
        _, best, _, _ = make_plan(plan_spec(cfg), planning_model(cfg), 2, 2, "cpu", facts={})
        assert {o.sharding_type for o in best} == {kind}
        for option in best:
            dim = int(option.tensor.shape[1])
            for shard in option.shards:
                # a table-wise table sits on one of the 2 ranks: output_ms is a rank's share of it, on average
                assert shard.perf.fwd_comms == pytest.approx(share * output_ms(c, kind, 512, 2, 2, dim, "fwd"),
                                                             rel=1e-6)
                assert shard.perf.bwd_comms == pytest.approx(share * output_ms(c, kind, 512, 2, 2, dim, "bwd"),
                                                             rel=1e-6)
