"""A training job's measured step beside its plan's estimate: each rank's error (what the MLflow run logs as
``error/...``) and the table rank 0 prints. The estimate is the whole step where the plan was made with a
calibration (``plan/rank<r>/whole_step_ms``), else TorchRec's embeddings-only one."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple


def _estimates(plan: Dict[str, float], r: int) -> Tuple[Optional[float], Optional[float]]:
    """Rank ``r``'s estimated step and embedding forward: the whole step's (with a calibration), else TorchRec's
    embeddings-only ones."""
    if f"plan/rank{r}/whole_step_ms" in plan:
        return plan[f"plan/rank{r}/whole_step_ms"], plan.get(f"plan/rank{r}/est_embedding_fwd_ms")
    fwd = [plan.get(f"plan/rank{r}/{k}") for k in ("fwd_compute_ms", "fwd_comms_ms")]
    parts = [v for v in fwd if v is not None]
    return plan.get(f"plan/rank{r}/total_ms"), sum(parts) if len(parts) == len(fwd) else None


def estimate_errors(per_rank: List[Dict[str, Any]], plan: Dict[str, float]) -> Dict[str, float]:
    """Each rank's estimate error (estimated over measured, less one) of the step and the embedding forward:
    ``error/rank<r>/step``, ``error/rank<r>/embedding_fwd``, and ``error/step`` for the slowest rank's step; and of
    memory, the plan's storage for the rank with the dense part's state (``estimated/rank<r>/mem_bytes``) over
    what the rank holds above its baseline: ``error/rank<r>/mem``, ``error/mem`` (the largest)."""
    out: Dict[str, float] = {}
    for r, x in enumerate(per_rank):
        step, fwd = _estimates(plan, r)
        if step and x.get("step_ms"):
            out[f"error/rank{r}/step"] = step / x["step_ms"] - 1
        if fwd and x.get("embedding_fwd_ms"):
            out[f"error/rank{r}/embedding_fwd"] = fwd / x["embedding_fwd_ms"] - 1
    for r, x in enumerate(per_rank):  # memory: the plan's storage for the rank and the dense part's state
        storage = plan.get(f"plan/rank{r}/{'hbm' if x.get('device') == 'cuda' else 'ddr'}_bytes")
        if storage and x.get("mem_over_baseline_bytes"):
            out[f"estimated/rank{r}/mem_bytes"] = storage + float(x.get("dense_state_bytes") or 0.0)
            out[f"error/rank{r}/mem"] = out[f"estimated/rank{r}/mem_bytes"] / x["mem_over_baseline_bytes"] - 1
    if any(k.endswith("/mem") for k in out):
        out["error/mem"] = max((v for k, v in out.items() if k.endswith("/mem")), key=abs)
    est = plan.get("plan/est_whole_step_ms") or plan.get("plan/est_step_ms")
    slowest = max((x["step_ms"] or 0.0 for x in per_rank), default=0.0)
    if est and slowest > 0:  # a job that trained no step (resumed at its end) measured none
        out["error/step"] = est / slowest - 1
    return out


def against_estimates(per_rank: List[Dict[str, Any]], plan: Dict[str, float], shown: int = 8) -> str:
    """Each rank's measured step and embedding forward beside the plan's estimates (the whole step with a
    calibration; else the embeddings only: lookups and their all-to-alls, forward and backward), the busiest
    ``shown`` ranks by measured step."""
    def ms(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, (int, float)) else "-"
    order = sorted(range(len(per_rank)), key=lambda r: -per_rank[r]["step_ms"])[:shown]
    covers = ("the whole step, with this machine's calibration" if "plan/est_whole_step_ms" in plan else
              "the embeddings only, with TorchRec's default constants; the rest of the measured step is the dense "
              "part, the optimizer and the input: python -m runner mode=calibrate estimates the whole step")
    lines = [f"[runner] measured vs the plan's estimate, ms per step (the estimate covers {covers}):",
             "  rank   step  emb fwd | est fwd  est step  error"]
    for r in sorted(order):
        step, fwd = _estimates(plan, r)
        error = f"{step / per_rank[r]['step_ms'] - 1:+.0%}" if step and per_rank[r]["step_ms"] else "-"
        lines.append(f"  {r:>4} {ms(per_rank[r]['step_ms']):>7} {ms(per_rank[r].get('embedding_fwd_ms')):>8} | "
                     f"{ms(fwd):>7} {ms(step):>9} {error:>6}")
    if len(per_rank) > shown:
        lines.append(f"  ({shown} busiest of {len(per_rank)} ranks; every rank in measured.json and the MLflow run)")
    return "\n".join(lines)
