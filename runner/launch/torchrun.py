"""A job under a plain ``torchrun``, without the runner's driver: the launch path users of hand-written
TorchRec scripts know.

``torchrun --standalone --nproc_per_node=2 -m runner.launch.torchrun resolved.yaml`` (a config from
``python -m runner ... --cfg job --resolve``, or a run folder's ``resolved.yaml``): each rank runs as the
runner's own workers do (:func:`runner.train.worker.run_guarded`); results go to the config file's folder.
With no driver, rank 0's process holds the job's MLflow run (:func:`runner.track.mlflow_run.torchrun_run`) and
ends it as the driver does (:mod:`runner.launch.job.end`), from the job's outcome as the driver computes it
(:mod:`runner.launch.job.outcome`; the failure named by the earliest rank's recorded error), which it also
records in ``status.json``.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from runner.config.errors import ConfigError
from runner.config.schema import load_resolved
from runner.config.validation import validate
from runner.launch import schedulers
from runner.launch.job import outcome
from runner.launch.job.end import PlanChart, end_finished_run, end_job_run
from runner.launch.processes.supervisor import root_cause
from runner.runtime import signals
from runner.train import worker

if TYPE_CHECKING:
    from runner.track.mlflow_run import MlflowRun


def main(argv: list[str]) -> int:
    """One rank under torchrun; its exit code."""
    if len(argv) != 1:
        print("usage: torchrun --nproc_per_node=N -m runner.launch.torchrun <resolved config.yaml>", file=sys.stderr)
        return 2
    path = Path(argv[0]).resolve()
    try:
        cfg = load_resolved(path)
        validate(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    scheduler = schedulers.named(cfg.cluster.scheduler)  # the job's, resolved once
    signals.install()  # torchrun stops its workers with SIGTERM: rank 0 then writes its reports, ends the run KILLED
    from runner.track.mlflow_run import torchrun_run

    run: Optional[MlflowRun] = None  # rank 0's, once opened

    def open_run() -> None:  # with the process group up: if the store refuses, every peer fails at once
        nonlocal run
        if os.environ.get("RANK") == "0":
            run = torchrun_run(cfg, path.parent)

    try:
        results = worker.run_guarded(path.parent, cfg.cluster.pg_timeout_s,
                                     lambda: worker.run(cfg, path.parent, open_run, schedulers.allocations()))
    except BaseException as exc:
        # stopped (by torchrun's SIGTERM, or Ctrl-C), whatever error the stop caused here first (a peer that
        # stopped before this rank breaks its collective); else the job's failure as the driver names it: the
        # earliest rank's recorded error
        stop = signals.received()
        stopped = stop is not None or isinstance(exc, KeyboardInterrupt)
        if os.environ.get("RANK") == "0":  # rank 0 holds the job's outcome: its run and status.json
            end = outcome.of_error(exc if stopped else root_cause(path.parent), scheduler, path.parent, stop)
            with signals.uninterrupted():  # a second SIGTERM (torchrun's peers are stopping too) waits for the end
                if run is not None:
                    end_job_run(run, end)
                outcome.write(end, path.parent)
        if not stopped:
            raise
        name = stop or signals.stopped(exc).name
        print(f"[runner] rank {os.environ.get('RANK', '?')} stopped by {name}", file=sys.stderr, flush=True)
        return signals.Stopped(signal.Signals[name]).exit_code
    if run is not None:
        try:
            outcome.write(end_finished_run(run, PlanChart(path.parent), results), path.parent)
        except Exception as exc:  # noqa: BLE001 - the ranks' work is done and on disk; its record is said
            print(f"[runner] warning: could not end the MLflow run: {exc}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
