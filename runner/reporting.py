"""What rank 0 reports while a job runs: the plan, progress, metrics and results.

Other ranks get the same calls and stay quiet, so training code never branches on rank.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

from omegaconf import OmegaConf

from runner import tracking

RUN_INFO = "run.json"
RESULTS = "results.json"


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kwargs: Any) -> None:
        pass


class Reporter:
    """Rank 0's link to the run folder and the job's MLflow run (created here under plain torchrun)."""

    def __init__(self, cfg: Any, run_dir: Path, rank: int) -> None:
        self.cfg, self.run_dir, self.rank = cfg, run_dir, rank
        self.active = rank == 0
        self.standalone = False
        self.uri: Optional[str] = None
        self.run_id: Optional[str] = None
        if not self.active:
            return
        info_file = run_dir / RUN_INFO
        if info_file.exists():
            info = json.loads(info_file.read_text())
            self.uri, self.run_id = info["tracking_uri"], info["run_id"]
        else:  # started by an external torchrun: this process owns the run
            self.standalone = True
            self.uri = tracking.tracking_uri(cfg)
            name = cfg.tracking.run_name or f"{cfg.model.name}-{cfg.sharding.name}-{cfg.cluster.name}"
            self.run_id = tracking.start_run(self.uri, cfg.tracking.experiment, name, None,
                                             {"runner.launcher": "torchrun"})
            tracking.log_params(self.uri, self.run_id, tracking.flatten(OmegaConf.to_container(cfg)))

    def plan(self, plan: Any, estimates: Any, plan_s: float, world: int, local_world: int,
             device: Any) -> None:
        """Write the plan (JSON, table) and the planner's estimates; log them to MLflow."""
        if not self.active:
            return
        from runner.planning import per_rank_estimates, plan_table, plan_to_dict, sharding_types_used

        plan_dict = plan_to_dict(plan)
        ranks = per_rank_estimates(estimates)
        types = sharding_types_used(plan_dict)
        out = self.run_dir / "plan"
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(json.dumps(plan_dict, indent=2))
        table = plan_table(plan_dict)
        (out / "plan.txt").write_text(table)
        (out / "estimates.json").write_text(json.dumps({"per_rank": ranks}, indent=2))
        print(f"[runner] sharding plan ({world} ranks, planned in {plan_s:.2f}s):\n{table}", flush=True)
        metrics: Dict[str, float] = {"plan/seconds": plan_s}
        metrics.update({f"plan/tables_{t}": n for t, n in types.items()})
        for r, est in enumerate(ranks):
            metrics.update({f"plan/rank{r}/{k}": v for k, v in est.items()})
        if ranks:
            totals = [r["total_ms"] for r in ranks]
            metrics["plan/est_step_ms"] = max(totals)
            mean = sum(totals) / len(totals)
            metrics["plan/perf_imbalance"] = max(totals) / mean if mean > 0 else 1.0
        tracking.log_metrics(self.uri, self.run_id, metrics, step=0)
        tracking.set_tags(self.uri, self.run_id, {
            "runner.world_size": world, "runner.local_world_size": local_world,
            "runner.nodes": world // local_world, "runner.device": str(device),
            "runner.sharding_types": ",".join(types),
        })
        tracking.log_artifacts(self.uri, self.run_id, sorted(out.iterdir()), artifact_path="plan")

    @contextlib.contextmanager
    def progress(self, steps: int) -> Iterator[Any]:
        if not self.active:
            yield _Silent()
            return
        from tqdm import tqdm

        bar = tqdm(total=steps, desc="train", unit="step", file=sys.stderr, mininterval=1.0,
                   dynamic_ncols=True)
        try:
            yield bar
        finally:
            bar.close()

    def train_metrics(self, step: int, metrics: Dict[str, float]) -> None:
        if self.active:
            tracking.log_metrics(self.uri, self.run_id, metrics, step=step)

    def finish(self, result: Any, eval_metrics: Dict[str, float], world: int) -> Dict[str, Any]:
        """Log final metrics; write ``results.json`` for the driver's summary line."""
        if not self.active:
            return {}
        final = {"train/final_loss": result.final_loss, "train/avg_samples_per_s": result.samples_per_s,
                 "train/avg_step_ms": result.step_time_ms, **eval_metrics}
        tracking.log_metrics(self.uri, self.run_id, final, step=self.cfg.train.steps)
        results = {
            "run_id": self.run_id, "tracking_uri": self.uri, "world_size": world,
            "final_loss": result.final_loss, "losses": result.losses, "samples_per_s": result.samples_per_s,
            "eval_auc": eval_metrics["eval/auc"], "eval_logloss": eval_metrics["eval/logloss"],
        }
        (self.run_dir / RESULTS).write_text(json.dumps(results, indent=2))
        if self.standalone:
            tracking.end_run(self.uri, self.run_id, "FINISHED")
            print(summary_line(results), flush=True)
        return results


def summary_line(results: Dict[str, Any]) -> str:
    return (
        f"[runner] done: final loss {results['final_loss']:.4f}, eval AUC {results['eval_auc']:.4f}, "
        f"{results['samples_per_s']:.0f} samples/s, MLflow run {results['run_id']}; "
        f"view: {tracking.ui_command(results['tracking_uri'])}"
    )
