"""System metrics (CPU, memory, disk, network; GPU utilisation and memory on a CUDA machine) over a
training run, recorded by MLflow's own monitor (``psutil``, ``nvidia-ml-py``) into the run's System metrics.

The driver of each host starts one monitor while its workers run: the host that opened the run as soon as
it has opened it, another node of a Slurm job once node 0 has published the run (``run.json`` in the job's
shared run folder). With more than one node the metrics carry the node: ``system/node_1/cpu_utilization_percentage``.
``tracking.system_metrics=false`` turns them off; ``tracking.system_metrics_interval_s`` is the sampling period.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

from runner.config.modes import MODES

if TYPE_CHECKING:
    from runner.config.schema import TrackingSchema


class SystemMetrics:
    """One host's monitor for one run; :meth:`stop` logs what it sampled last (call it before the run ends)."""

    def __init__(self, uri: str, run_id: str, node: Optional[int], interval_s: float) -> None:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        logging.getLogger("mlflow.system_metrics").setLevel(logging.ERROR)  # "Started monitoring ..." lines
        self._monitor: Any = SystemMetricsMonitor(run_id, sampling_interval=interval_s, samples_before_logging=1,
                                                  node_id=None if node is None else f"node_{node}", tracking_uri=uri)
        self._monitor.start()

    def stop(self) -> None:
        """Stop sampling and log the samples taken since the last logged point (a run shorter than one
        interval still gets its point)."""
        monitor, self._monitor = self._monitor, None
        if monitor is None:
            return
        try:
            monitor.finish()
            if any(m.metrics for m in monitor.monitors):
                monitor.collect_metrics()  # the state at the end, with the samples of the unfinished interval
                monitor.publish_metrics(monitor.aggregate_metrics())
                monitor.mlflow_logger.flush()
        except Exception as exc:  # e.g. a tracking outage: the run's own ending matters more than these samples
            logging.getLogger("runner").warning("last system metrics not logged: %s", exc)


def start_system_metrics(tracking: TrackingSchema, mode: str, nodes: int, uri: str, run_id: str,
                         node: int) -> Optional[SystemMetrics]:
    """A monitor for this host's share of ``run_id`` (a job of ``mode`` on ``nodes`` nodes), or None when
    ``tracking.system_metrics`` is off or the job's mode logs none (or MLflow's monitor cannot start here: the run
    goes on without it)."""
    if not MODES[mode].system_metrics or not tracking.system_metrics:
        return None
    try:
        return SystemMetrics(uri, run_id, node if nodes > 1 else None, float(tracking.system_metrics_interval_s))
    except Exception as exc:  # e.g. psutil missing from a hand-made environment
        logging.getLogger("runner").warning("system metrics off for this run: %s", exc)
        return None
