"""``python -m runner diff A B``: what differs between two runs, in a few lines each.

A and B are run folders or MLflow run ids (looked up in ``$MLFLOW_TRACKING_URI`` or the project's
store). Printed: the config keys whose values differ, the tables whose sharding differs (type, kernel,
ranks), and the headline metrics side by side. A run's folder is read when it is still on this disk
(``resolved.yaml``, ``plan/``, ``results.json``); otherwise the run's params, ``plan/plan.json``
artifact and metrics in the store.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from runner.config.secrets import redact_uri
from runner.runtime import run_files
from runner.track import store

# (label, MLflow metric, results.json key); memory shown in GiB
HEADLINE = [("final loss", "train/final_loss", "final_loss"), ("eval AUC", "eval/auc", "eval_auc"),
            ("eval NE", "eval/ne", "eval_ne"), ("samples/s", "train/avg_samples_per_s", "samples_per_s"),
            ("estimated step ms", "plan/est_step_ms", "est_step_ms"),
            ("max memory per rank GiB", "plan/max_mem_bytes", "max_mem_bytes")]
MAX_KEYS = 40  # config keys listed before "... and N more"


@dataclass
class RunView:
    """What ``diff`` compares of one run."""

    label: str
    config: Dict[str, str]
    plan: Optional[Dict[str, Dict[str, Any]]] = None
    metrics: Dict[str, float] = field(default_factory=dict)


class DiffError(Exception):
    pass


def from_folder(folder: Path) -> RunView:
    """A run folder's config, plan and headline metrics (from its files: no store needed)."""
    import yaml

    resolved = folder / run_files.RESOLVED
    if not resolved.exists():
        raise DiffError(f"{folder} is not a run folder (no {run_files.RESOLVED})")
    config = store.flatten(yaml.safe_load(resolved.read_text()) or {})
    results = run_files.read_json(folder / run_files.RESULTS) or {}
    metrics = {metric: float(results[key]) for _, metric, key in HEADLINE if results.get(key) is not None}
    estimates = run_files.read_json(folder / run_files.PLAN / "estimates.json") or {}
    ranks = estimates.get("per_rank") or []
    if ranks and estimates.get("estimated", True):
        mem = "hbm_bytes" if estimates.get("device") == "cuda" else "ddr_bytes"
        metrics.setdefault("plan/est_step_ms", max(r["total_ms"] for r in ranks))
        metrics.setdefault("plan/max_mem_bytes", max(r[mem] for r in ranks))
    return RunView(str(folder), config, run_files.read_json(folder / run_files.PLAN / "plan.json"), metrics)


def from_run_id(uri: str, run_id: str) -> RunView:
    """An MLflow run: its folder when still on this disk, else its params, plan artifact and metrics."""
    try:
        run = store.client(uri).get_run(run_id)
    except Exception as exc:  # noqa: BLE001 - not found, or the store cannot be read: one line either way
        raise DiffError(f"{run_id} is neither a run folder nor a run in {redact_uri(uri)} "
                        f"({str(exc).splitlines()[0][:200]})") from None
    folder = Path(run.data.tags.get("runner.run_dir", ""))
    if run.data.tags.get("runner.run_dir") and (folder / run_files.RESOLVED).exists():
        view = from_folder(folder)
        view.metrics.update({m: v for m, v in run.data.metrics.items() if m in {h[1] for h in HEADLINE}})
        view.label = f"{run.info.run_name} ({run_id})"
        return view
    with tempfile.TemporaryDirectory() as tmp:
        try:
            plan = run_files.read_json(Path(store.client(uri).download_artifacts(run_id, "plan/plan.json", tmp)))
        except Exception:  # noqa: BLE001 - a run without a plan (refused before planning)
            plan = None
    return RunView(f"{run.info.run_name} ({run_id})", dict(run.data.params), plan, dict(run.data.metrics))


def run_view(arg: str, uri: str) -> RunView:
    path = Path(arg)
    return from_folder(path.resolve()) if path.is_dir() else from_run_id(uri, arg)


def _placement(entry: Dict[str, Any]) -> str:
    ranks = entry.get("ranks") or []
    where = "every rank" if entry.get("sharding_type") == "data_parallel" else (
        f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(str(r) for r in ranks)}")
    return f"{entry.get('sharding_type')} {entry.get('compute_kernel')} {where}"


def lines(a: RunView, b: RunView) -> List[str]:
    out = [f"A: {a.label}", f"B: {b.label}"]
    keys = sorted(k for k in set(a.config) | set(b.config) if a.config.get(k) != b.config.get(k))
    out.append(f"config: {len(keys)} key(s) differ" + (":" if keys else ""))
    out += [f"  {k}: {a.config.get(k, '(absent)')} | {b.config.get(k, '(absent)')}" for k in keys[:MAX_KEYS]]
    if len(keys) > MAX_KEYS:
        out.append(f"  ... and {len(keys) - MAX_KEYS} more")
    if a.plan is None or b.plan is None:
        out.append("sharding: " + ("no plan in either" if a.plan is b.plan else
                                   f"only {'A' if a.plan is not None else 'B'} has a plan"))
    else:
        tables = {(m, t): (a.plan.get(m, {}).get(t), b.plan.get(m, {}).get(t))
                  for m in set(a.plan) | set(b.plan) for t in set(a.plan.get(m, {})) | set(b.plan.get(m, {}))}
        differ = sorted((t, x, y) for (_, t), (x, y) in tables.items()
                        if (x and _placement(x)) != (y and _placement(y)))
        out.append(f"sharding: {len(differ)} of {len(tables)} table(s) differ" + (":" if differ else ""))
        out += [f"  {t}: {_placement(x) if x else '(absent)'} | {_placement(y) if y else '(absent)'}"
                for t, x, y in differ[:MAX_KEYS]]
    out.append(f"metrics: {'':24s}{'A':>14s}{'B':>14s}")
    for label, metric, _ in HEADLINE:
        va, vb = a.metrics.get(metric), b.metrics.get(metric)
        if va is None and vb is None:
            continue
        scale = 2**-30 if metric == "plan/max_mem_bytes" else 1.0
        shown = [f"{v * scale:14.4f}" if v is not None else f"{'-':>14s}" for v in (va, vb)]
        out.append(f"  {label:30s}{shown[0]}{shown[1]}")
    return out


def diff(args: List[str]) -> int:
    """The ``diff`` command: 0 when both runs were read, 2 on bad arguments or a run that cannot be read."""
    if len(args) != 2 or any(a.startswith("-") for a in args):
        print("usage: python -m runner diff <run folder or run id> <run folder or run id>", file=sys.stderr)
        return 2
    uri = store.tracking_uri(None)
    try:
        a, b = (run_view(arg, uri) for arg in args)
    except DiffError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines(a, b)))
    return 0
