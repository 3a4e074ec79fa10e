"""How close the plan's estimated step is to the step a job measures, with TorchRec's default constants and with
this machine's calibration, on training configs the calibration never saw; and a plan study where the calibrated
planner chooses another plan than the default one, both trained.

    .venv/bin/python benchmarks/estimates.py [--steps 100] [--only 1,4] [--device cpu|cuda] [--no-study]
                                             [--study-repeats 3] [--trust 5] [--calibration-max-age 5]

0. ``--trust``: ``mode=calibrate`` at 1 x 2, 5 times as the machine is and 5 times beside one busy process: whether
   ``cluster.calibration=auto`` takes each with its collectives, kernels and dense part trusted, and its seconds.

1. ``python -m runner mode=calibrate`` for each world shape the configs use (1 x 2, 2 x 2, 1 x 4 on CPU; 1 x 1 on a
   GPU), into this run's own calibration folder; each file's trust is printed (the repeats' spread). Before each
   config (held-out and ranking alike) its shape's calibration is made again when it is older than
   ``--calibration-max-age`` minutes (5), as a user calibrates before planning: this machine's speed moves within
   the hour, and each refresh prints how far.
2. Each held-out config (:data:`CONFIGS`: DLRM, DCN, DeepFM, MMoE, Criteo-DLRM and generated models of 6 to 300
   tables; table-, row-, column-wise, data-parallel and the planner's choice; batch 256 to 8192; 2 and 4 workers on 1
   and 2 emulated nodes) trains ``--steps`` steps with its shape's calibration. Per config: the measured step and
   embedding forward (the slowest rank's, ``measured.json``), the calibrated estimate of the same plan (the whole
   step and the embedding forward, ``plan/estimates.json``), and TorchRec's default-constant estimate (what the
   runner shows without a calibration: the embeddings only), planned here with ``cluster.calibration=none``;
   ``same`` says whether that plan is the trained one.
4. The ranking study (:mod:`ranking`): eight configs, each planned four or more ways, every plan trained
   ``--ranking-repeats`` times alternating: how often each cost model picks the measured fastest and orders pairs of
   plans as measured.
3. The plan study: ``cluster=2node`` DLRM planned and trained with ``cluster.calibration=none`` and with the
   calibration, ``--study-repeats`` times each, alternating; each plan's sharding types and median measured step, and
   the calibrated plan's gain.

Ends with ``estimates: configs=.. median_error calibrated=..% default=..% | largest calibrated=..% default=..% |
study gain=..%`` and the import floor (``python -c "import torchrec.distributed.planner, mlflow, hydra"``) beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import ranking  # noqa: E402
from plan_scale import import_floor  # noqa: E402

GEN = "model=dnn_many model.generated_tables.max_rows=20000"
CONFIGS: List[Tuple[str, str]] = [  # (name, overrides): none of them is the calibration's own job
    ("dlrm tw b256", "sharding=tablewise train.batch_size=256"),
    ("dlrm rw b1024", "sharding=rowwise train.batch_size=1024"),
    ("dlrm dp b512", "sharding=dataparallel train.batch_size=512"),
    ("dnn6x256 cw b512", f"{GEN} model.generated_tables.count=6 model.generated_tables.dims=[256] "
                         "sharding=columnwise train.batch_size=512"),
    ("dcn tw b2048", "model=dcn sharding=tablewise train.batch_size=2048"),
    ("deepfm rw b4096", "model=deepfm sharding=rowwise train.batch_size=4096"),
    ("mmoe tw b512", "model=mmoe sharding=tablewise train.batch_size=512"),
    ("dlrm tw b8192", "sharding=tablewise train.batch_size=8192"),
    ("dnn300 tw b256", f"{GEN} model.generated_tables.count=300 sharding=tablewise train.batch_size=256"),
    ("criteo auto b1024", "model=dlrm_criteo train.batch_size=1024"),
    ("2node dlrm rw b256", "cluster=2node sharding=rowwise train.batch_size=256"),
    ("2node dlrm tw b1024", "cluster=2node sharding=tablewise train.batch_size=1024"),
    ("2node dcn dp b512", "cluster=2node model=dcn sharding=dataparallel train.batch_size=512"),
    ("1x4 dlrm tw b512", "cluster.workers_per_node=4 sharding=tablewise train.batch_size=512"),
]
STUDY = "cluster=2node train.batch_size=512"


def runner(args: List[str], store: str) -> Tuple[Path, str]:
    """``python -m runner ARGS`` (its own experiment in ``store``); its run folder and output."""
    done = subprocess.run([sys.executable, "-m", "runner", *args, f"tracking.uri={store}",
                           "tracking.experiment=bench-estimates", "tracking.system_metrics=false"],
                          cwd=ROOT, text=True, capture_output=True)
    out = done.stdout + done.stderr
    found = re.search(r"run folder (\S+)", out)
    if done.returncode != 0 or not found:
        raise SystemExit(f"failed: python -m runner {' '.join(args)}\n{out[-3000:]}")
    return Path(found.group(1)), out


def shape_of(overrides: str, device: str) -> Tuple[int, int]:
    if device == "cuda":
        return 1, 1
    nodes = 2 if "cluster=2node" in overrides else 1
    found = re.search(r"cluster.workers_per_node=(\d+)", overrides)
    return nodes, int(found.group(1)) if found else 2


def shape_args(shape: Tuple[int, int], device: str) -> List[str]:
    return [f"cluster.nodes={shape[0]}", f"cluster.workers_per_node={shape[1]}", f"cluster.device={device}"]


def calibrate(shape: Tuple[int, int], device: str, folder: Path, store: str) -> Path:
    run_folder, out = runner(["mode=calibrate", *shape_args(shape, device), f"cluster.calibration_dir={folder}"], store)
    lines = [ln[len("[runner] calibration: "):] for ln in out.splitlines() if ln.startswith("[runner] calibration: ")]
    print(f"calibration {shape[0]} x {shape[1]}: {'; '.join(lines)}", flush=True)
    return run_folder / "calibration" / "calibration.yaml"


class Calibrations(dict):
    """Each world shape's calibration file, made again when it is older than ``max_age_s`` as a config asks for it
    (0: the first one throughout; learning from runs refits the newest, from runs planned with any of its shape's,
    as they share the hardware's fingerprint): a user calibrates, then plans and trains, and this machine's speed
    moves within the hour
    (2026-11-30: a 1 x 2 calibration at 06:29 measured the device at 19.7 GiB/s, the all-to-all at 1.64 GiB/s and
    DLRM's dense forward at 256 samples at 0.59 ms; one at 07:04, 13.4, 0.99 and 1.10; a table-wise DLRM at 256
    estimated with the first read 31% low, with the second 5%). Each refresh prints how far the machine moved since
    the last (:func:`drift`); one that fails keeps the calibration it had."""

    def __init__(self, make: Callable[[Tuple[int, int]], Path], max_age_s: float) -> None:
        super().__init__()
        self.make, self.max_age_s, self.made, self.moves = make, max_age_s, {}, []

    def _make(self, shape: Tuple[int, int]) -> Path:
        self[shape] = path = self.make(shape)
        self.made[shape] = time.perf_counter()
        return path

    def __getitem__(self, shape: Tuple[int, int]) -> Path:
        if shape not in self:
            return self._make(shape)
        path = super().__getitem__(shape)
        if self.max_age_s and time.perf_counter() - self.made[shape] > self.max_age_s:
            try:
                fresh = self._make(shape)
            except SystemExit as exc:  # the calibration it had stands; tried again at the next config
                print(f"calibration {shape[0]} x {shape[1]} not made again ({str(exc)[:200]}): the last one kept",
                      flush=True)
                return path
            try:
                move = drift(path, fresh)
            except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
                print(f"calibration {shape[0]} x {shape[1]} made again; how far it moved not read ({exc!r})",
                      flush=True)
                return fresh
            self.moves.append(move["device"])
            print(f"calibration {shape[0]} x {shape[1]} made again after {self.max_age_s / 60:.0f} min: the device "
                  f"{move['device']:+.0%}, the all-to-all {move['all_to_all']:+.0%}, the dense forward "
                  f"{move['dense']:+.0%} (time; + slower)", flush=True)
            path = fresh
        return path


def drift(old: Path, new: Path) -> Dict[str, float]:
    """How far the machine moved between two calibrations of one shape, as the relative change of a time: the
    embedding kernel's (the inverse of its bandwidth), the all-to-all's per byte, the dense part's forward at the
    largest batch it was timed at (its median)."""
    import yaml

    a, b = (yaml.safe_load(p.read_text()) for p in (old, new))

    def a2a(d: Dict[str, Any]) -> float:
        fit = ((d["constants"].get("collectives") or {}).get("all_to_all") or {}).get("intra") or {}
        return float(fit.get("bandwidth_gibps") or "nan")

    def dense(d: Dict[str, Any]) -> float:
        by_rows = d["measurements"]["dense"]
        samples = by_rows[max(by_rows, key=int)]["fwd"]
        return float(statistics.median(samples)) if isinstance(samples, list) else float(samples)

    return {"device": a["constants"]["device_bw_gibps"] / b["constants"]["device_bw_gibps"] - 1,
            "all_to_all": a2a(a) / a2a(b) - 1, "dense": dense(b) / dense(a) - 1}


def trust_study(tries: int, device: str, folder: Path, store: str, floor: float) -> Dict[str, int]:
    """``mode=calibrate`` at 1 x 2, ``tries`` times on the machine as it is and ``tries`` times beside one busy
    process: per try, the seconds, each part's trust and whether ``cluster.calibration=auto`` takes the file with
    the collectives, kernels and dense part all trusted. Returns how many tries did, quiet and busy."""
    import yaml

    got = {"quiet": 0, "busy": 0}
    for label in ("quiet", "busy"):
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if label == "busy" else None
        try:
            for i in range(tries):
                start = time.perf_counter()
                run_folder, _ = runner(["mode=calibrate", *shape_args((1, 2), device),
                                     f"cluster.calibration_dir={folder / f'{label}{i}'}"], store)
                seconds = time.perf_counter() - start
                data = yaml.safe_load((run_folder / "calibration" / "calibration.yaml").read_text())
                trusted, errors = data["trusted"], data["median_error"]
                kept = any((folder / f"{label}{i}").glob("*.calibration.yaml"))
                used = kept and all(trusted[p] for p in ("collectives", "kernels", "dense"))
                got[label] += used
                print(f"trust {label} {i + 1}/{tries}: {seconds:.0f} s (bound {90 * floor / 4:.0f} s), "
                      + ", ".join(f"{p} {'yes' if ok else 'NO'} ({errors.get(p, 0):.1%})" for p, ok in trusted.items())
                      + f"; taken by auto with collectives, kernels and dense trusted: {'yes' if used else 'no'}",
                      flush=True)
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
    print(f"trust: {got['quiet']} of {tries} tries quiet, {got['busy']} of {tries} beside a busy process", flush=True)
    return got


def default_estimate(overrides: List[str], world: int, local: int, device: str) -> Tuple[float, float, Any]:
    """TorchRec's default constants: the plan's estimated step (embeddings only, the busiest rank) and embedding
    forward, and the plan, planned here as the runner plans it (:func:`ranking.plan_here`)."""
    from runner.plan.analysis import per_rank_estimates

    plan, _, best = ranking.plan_here([*overrides, "cluster.calibration=none"], world, local, device)
    ranks = per_rank_estimates(best, world)
    return (max(r["total_ms"] for r in ranks), max(r["fwd_compute_ms"] + r["fwd_comms_ms"] for r in ranks), plan)


def measure(name: str, overrides: str, calibration: Path, steps: int, device: str, store: str) -> Dict[str, Any]:
    args = [*overrides.split(), f"cluster.calibration={calibration}", f"train.steps={steps}",
            f"cluster.device={device}", "train.checkpoint.enabled=false"]
    if device == "cuda":
        args += ["cluster.nodes=1", "cluster.workers_per_node=1"]  # one GPU: every config as 1 x 1
    run_folder, _ = runner(args, store)
    measured = json.loads((run_folder / "measured.json").read_text())
    est = json.loads((run_folder / "plan" / "estimates.json").read_text())
    step = est.get("step") or {}
    slowest = max(range(len(measured["per_rank"])), key=lambda r: measured["per_rank"][r]["step_ms"])
    fwd = [x.get("embedding_fwd_ms") or 0.0 for x in measured["per_rank"]]
    world, local = len(measured["per_rank"]), est["local_world_size"]
    d_step, d_fwd, d_plan = default_estimate([a for a in args if not a.startswith("cluster.calibration=")], world,
                                             local, device)
    trained = json.loads((run_folder / "plan" / "plan.json").read_text())
    held = [measured.get(f"measured/rank{r}/mem_over_baseline_bytes") for r in range(world)]
    mem_rank = max(range(world), key=lambda r: held[r] or 0.0)  # the rank that holds most
    return {"mem_measured": held[mem_rank], "mem_estimated": measured.get(f"estimated/rank{mem_rank}/mem_bytes"),
            "name": name, "run_folder": run_folder, "shape": (world // local, local), "args": args,
            "repeats": [measured["per_rank"][slowest]["step_ms"]], "measured": measured["per_rank"][slowest]["step_ms"],
            "measured_fwd": max(fwd), "repeats_fwd": [max(fwd)],
            "calibrated": step.get("step_ms"), "speed_now": step.get("speed_now") or {},
            "calibrated_fwd": max(x["embedding_fwd_ms"] for x in step["per_rank"]) if step else None,
            "default": d_step, "default_fwd": d_fwd, "same": d_plan == trained}


def learning(rows: List[Dict[str, Any]], calibrations: Dict[Tuple[int, int], Path]) -> None:
    """Learning from runs, shown: each world's newest calibration refitted (:mod:`runner.plan.cost.learn`) from the
    runs of its first, third, ... configs (planned with it or an older calibration of its shape), as
    ``learn-calibration`` does (kept as measured where the refit estimates a run left out
    of it no better: :func:`runner.plan.cost.learn.choose`), and the estimates of the others before and after (their
    overhead recomputed)."""
    from runner.plan.cost import learn
    from runner.plan.cost.calibration import load_calibration

    for knocked in (False, True):
        before: List[float] = []
        after: List[float] = []
        what = " without its step overhead and wait" if knocked else ""
        for shape, path in sorted(calibrations.items()):
            mine = [r for r in rows if r["shape"] == shape and r["calibrated"]]
            cal = load_calibration(path)
            if knocked:  # a term the calibration lacks, its side kept: what learning exists to recover
                cal = dataclasses.replace(cal, constants={
                    **cal.constants, "step_overhead": {**cal.constants["step_overhead"], "fixed_ms": 0.0,
                                                       "per_table_ms": 0.0, "ms_per_unit": 0.0, "ms_per_ksample": 0.0},
                    "rank_wait": {**(cal.constants.get("rank_wait") or {}), "factor": 1.0}})
            taught = learn.run_points([r["run_folder"] for r in mine[0::2]], cal)
            if len(taught) < learn.MIN_RUNS:
                continue
            learned, how = learn.choose(cal, taught, "bench-estimates")
            print(f"learning {shape[0]} x {shape[1]}{what} from {len(taught)} runs: {how}", flush=True)
            new = (learned or cal).constants
            for row in mine[1::2]:
                for p in learn.run_points([row["run_folder"]], cal):
                    was, now = learn.estimate_ms(cal.constants, p), learn.estimate_ms(new, p)
                    before.append(was / row["measured"] - 1)
                    after.append(now / row["measured"] - 1)
                    print(f"learning {shape[0]} x {shape[1]}{what}, {row['name']} (held out): {pct(before[-1])} "
                          f"before, {pct(after[-1])} after learning from {len(taught)} runs", flush=True)
        if before:
            print(f"learning{' (the calibration' + what + ')' if knocked else ''}: held-out median |error| "
                  f"{statistics.median(map(abs, before)):.1%} before, {statistics.median(map(abs, after)):.1%} after;"
                  f" signed median {statistics.median(before):+.1%} before, {statistics.median(after):+.1%} after",
                  flush=True)


def error(est: Optional[float], measured: float) -> Optional[float]:
    return None if est is None or not measured else est / measured - 1


def pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:+.0%}"


def table(rows: List[Dict[str, Any]]) -> Dict[str, List[float]]:
    print(f"\n{'config':<20} {'step ms':>8} {'noise':>6} {'calib.':>8} {'err':>6} {'default':>8} {'err':>6} | "
          f"{'emb fwd':>8} {'noise':>6} "
          f"{'calib.':>7} {'err':>6} {'default':>7} {'err':>6} same plan | {'mem MiB':>7} {'est.':>7} {'err':>6}")
    errors: Dict[str, List[float]] = {"calibrated": [], "default": [], "calibrated_fwd": [], "default_fwd": [],
                                      "memory": []}
    for r in rows:
        e = {k: error(r[k], r["measured_fwd" if k.endswith("fwd") else "measured"])
             for k in ("calibrated", "default", "calibrated_fwd", "default_fwd")}
        e["memory"] = error(r.get("mem_estimated"), r.get("mem_measured") or 0.0)
        for k, v in e.items():
            if v is not None:
                errors[k].append(v)
        noise = (max(r["repeats"]) - min(r["repeats"])) / r["measured"] if r["measured"] else 0.0
        errors.setdefault("noise", []).append(noise)
        fwd_noise = (max(r["repeats_fwd"]) - min(r["repeats_fwd"])) / r["measured_fwd"] if r["measured_fwd"] else 0.0
        errors.setdefault("noise_fwd", []).append(fwd_noise)
        print(f"{r['name']:<20} {r['measured']:>8.2f} {noise:>6.0%} {r['calibrated'] or 0:>8.2f} "
              f"{pct(e['calibrated']):>6} "
              f"{r['default']:>8.3f} {pct(e['default']):>6} | {r['measured_fwd']:>8.2f} {fwd_noise:>6.0%} "
              f"{r['calibrated_fwd'] or 0:>7.2f} "
              f"{pct(e['calibrated_fwd']):>6} {r['default_fwd']:>7.3f} {pct(e['default_fwd']):>6} "
              f"{'yes' if r['same'] else 'no':>9} | {(r.get('mem_measured') or 0) / 2**20:>7.1f} "
              f"{(r.get('mem_estimated') or 0) / 2**20:>7.1f} {pct(e['memory']):>6}")
    for k, v in errors.items():
        if v and not k.startswith("noise"):
            print(f"{k:<15} median |error| {statistics.median(map(abs, v)):.1%}, signed median "
                  f"{statistics.median(v):+.1%}, largest {max(map(abs, v)):.1%}, low in {sum(x < 0 for x in v)} of "
                  f"{len(v)}")
    if errors.get("noise"):
        print(f"noise (each config's measured steps over its repeats, range over median): median "
              f"{statistics.median(errors['noise']):.1%}, largest {max(errors['noise']):.1%}; the embedding forward's "
              f"(timed after each training): median {statistics.median(errors['noise_fwd']):.1%}, largest "
              f"{max(errors['noise_fwd']):.1%}")
    return errors


def study(calibration: Path, steps: int, device: str, store: str, repeats: int) -> float:
    """The same job planned and trained with TorchRec's constants and with the calibration, ``repeats`` times each,
    alternating: the calibrated plan's gain in the median measured step (a fraction)."""
    got: Dict[str, List[float]] = {"TorchRec's constants": [], "calibrated": []}
    plans = {}
    for i in range(repeats):
        pair = [("TorchRec's constants", "none"), ("calibrated", str(calibration))]
        for label, cal in pair if i % 2 == 0 else pair[::-1]:
            run_folder, out = runner([*STUDY.split(), f"cluster.calibration={cal}", f"train.steps={steps}",
                                   "train.checkpoint.enabled=false"], store)
            got[label].append(json.loads((run_folder / "measured.json").read_text())["measured/step_ms"])
            plans[label] = next(ln for ln in out.splitlines() if ln.startswith("[runner] sharding plan:"))
    for label, steps_ms in got.items():
        print(f"study ({STUDY}), {label}: measured step {statistics.median(steps_ms):.2f} ms (median of "
              f"{', '.join(f'{v:.1f}' for v in steps_ms)}); {plans[label][len('[runner] '):][:100]}")
    default, calibrated = got["TorchRec's constants"], got["calibrated"]
    gain = 1 - statistics.median(calibrated) / statistics.median(default)
    wins = sum(c < d for c, d in zip(calibrated, default, strict=True))
    print(f"study: the calibrated plan's measured step is {gain:+.1%} faster than the default plan's "
          f"(faster in {wins} of {repeats} pairs)")
    return gain


def work_folder(root: Path) -> Path:
    """This run's own folder under ``root/outputs`` (made with it: a fresh clone has no ``outputs/``)."""
    (root / "outputs").mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="bench-estimates-", dir=root / "outputs"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--only", default="", help="comma-separated config numbers (1-based) to run; "
                    "none: the ranking study alone")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--no-study", action="store_true")
    ap.add_argument("--study-repeats", type=int, default=3, help="trainings of each of the study's two plans")
    ap.add_argument("--repeats", type=int, default=2, help="trainings of each config (the measurement's own noise)")
    ap.add_argument("--no-ranking", action="store_true", help="skip the ranking study")
    ap.add_argument("--ranking-repeats", type=int, default=3, help="trainings of each plan in the ranking study")
    ap.add_argument("--ranking-only", default="", help="comma-separated ranking configs (1-based) to run")
    ap.add_argument("--ranking-plans", type=int, default=0, help="at most this many distinct plans per ranking "
                    "config (0: all)")
    ap.add_argument("--ranking-budget-s", type=float, default=0.0, help="bound the ranking study's seconds (lent "
                    "device time): rounds beyond two only while they fit (0: none)")
    ap.add_argument("--calibration", type=Path, default=None, help="plan with this calibration file instead of "
                    "calibrating first (its world shape must be the configs'; e.g. a GPU's, measured in a first call)")
    ap.add_argument("--calibration-max-age", type=float, default=5.0, help="minutes: a shape's calibration is made "
                    "again before a config when older (0: the first one throughout)")
    ap.add_argument("--trust", type=int, default=5, help="mode=calibrate tries at 1 x 2, quiet and beside a busy "
                    "process, each judged by whether auto takes it (0: none)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning)  # TorchRec's, on every in-process plan
    floor = import_floor()
    print(f"import floor {floor:.1f} s", flush=True)
    work = work_folder(ROOT)
    store = f"sqlite:///{work / 'mlflow.db'}"
    picked = [] if args.only == "none" else \
        [CONFIGS[int(i) - 1] for i in args.only.split(",") if i] if args.only else CONFIGS
    t0 = time.perf_counter()
    study_here = not args.no_study and args.device == "cpu"
    ranking_here = not args.no_ranking
    shapes = {shape_of(o, args.device) for _, o in picked} | ({(2, 2)} if study_here else set())
    only = [int(i) for i in args.ranking_only.split(",") if i]
    if ranking_here:
        shapes |= {shape_of(o, args.device) for i, (_, o) in enumerate(ranking.RANKING) if not only or i + 1 in only}
    trusted = trust_study(args.trust, args.device, work / "trust", store, floor) if args.trust else {}
    calibrations = Calibrations(lambda s: args.calibration.resolve() if args.calibration else
                                calibrate(s, args.device, work / "calibrations", store),
                                0.0 if args.calibration else args.calibration_max_age * 60)
    for shape in sorted(shapes):
        print(f"calibration {shape[0]} x {shape[1]}: {calibrations[shape]}", flush=True)
    rows = []
    for name, overrides in picked:
        try:
            rows.append(measure(name, overrides, calibrations[shape_of(overrides, args.device)], args.steps,
                                args.device, store))
        except SystemExit as exc:  # one config's failure said, the others still measured (lent device time)
            print(f"{name}: {exc}", flush=True)
            continue
        speed = ", ".join(f"{k} {v:.2f}x" for k, v in rows[-1]["speed_now"].items())
        print(f"{name}: measured {rows[-1]['measured']:.2f} ms, calibrated estimate {rows[-1]['calibrated']:.2f} ms"
              + (f" (its probes against its calibration's: {speed})" if speed else ""), flush=True)
    for _ in range(args.repeats - 1):  # the machine's own noise: each config trained again, after all the others
        for row in rows:
            run_folder, _ = runner(row["args"], store)
            again = json.loads((run_folder / "measured.json").read_text())
            row["repeats"].append(again["measured/step_ms"])
            row["repeats_fwd"].append(max(x.get("embedding_fwd_ms") or 0.0 for x in again["per_rank"]))
    for row in rows:  # the step and the embedding forward alike: the median over the repeats
        row["measured"], row["measured_fwd"] = statistics.median(row["repeats"]), statistics.median(row["repeats_fwd"])
    errors = table(rows)
    learning(rows, calibrations)
    gain = study(calibrations[(2, 2)], args.steps, args.device, store, args.study_repeats) if study_here \
        else float("nan")
    if ranking_here:
        def train(overrides: List[str]) -> Tuple[float, Optional[float]]:
            run_folder, _ = runner([*overrides, f"train.steps={args.steps}", "train.checkpoint.enabled=false"], store)
            shown = json.loads((run_folder / "plan" / "estimates.json").read_text()).get("step") or {}
            return (float(json.loads((run_folder / "measured.json").read_text())["measured/step_ms"]),
                    shown.get("step_ms"))
        ranking.study(calibrations, lambda o: shape_of(o, args.device), train, args.device, work / "ranking",
                      args.ranking_repeats, only, args.ranking_plans, args.ranking_budget_s,
                      shape_args((1, 1), args.device) if args.device == "cuda" else [])  # one GPU: every config 1 x 1
    med = {k: statistics.median(map(abs, v)) if v else float("nan") for k, v in errors.items()}
    top = {k: max(map(abs, v)) if v else float("nan") for k, v in errors.items()}
    signed = statistics.median(errors["calibrated"]) if errors["calibrated"] else float("nan")
    print(f"\nestimates: configs={len(rows)} median_error calibrated={med['calibrated']:.1%} (signed {signed:+.1%}) "
          f"default={med['default']:.1%} | largest calibrated={top['calibrated']:.1%} default={top['default']:.1%} | "
          f"embedding fwd median calibrated={med['calibrated_fwd']:.1%} default={med['default_fwd']:.1%} | "
          f"study gain={gain:+.1%} | trusted quiet={trusted.get('quiet', '-')}/{args.trust} "
          f"busy={trusted.get('busy', '-')}/{args.trust} | calibrations made again {len(calibrations.moves)} times"
          + (f" (the device's time moved {min(calibrations.moves):+.0%} to {max(calibrations.moves):+.0%})"
             if calibrations.moves else "") + f" | {time.perf_counter() - t0:.0f} s, import floor "
          f"{floor:.1f} s ({work})")


if __name__ == "__main__":
    main()
