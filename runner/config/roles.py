"""What each config key is for: the one definition of "the same config".

Every key of the schema has one role:

- ``answer``: it can change what a job answers (its plan, its metrics, its checkpoints).
- ``record``: it only says where and how the job's run is recorded (the store, the experiment, the run's
  name, the presets' display names, system metrics).
- ``sweep``: it steers a sweep (retries, reuse, resume, what a job returns to a searching sweeper).

Two jobs have the same config when their ``answer`` keys are equal. Resume (a finished point is kept),
the ``runner.config_hash`` tag (``sweep.reuse`` looks for it) and plan-only reuse of enumerated sharding
options all read that from here, so that they cannot disagree. Resume and ``sweep.reuse`` also need the
earlier run recorded where this job records (the same store and experiment): ``sweep.reuse`` searches only
there, and resume keeps a point only when its run is there.

``NOT_ENUMERATED`` lists the ``answer`` keys that TorchRec's enumeration of sharding options does not read
(the search's inputs: bandwidths, storage reserve, proposer; and how workers are launched), so that a
plan-only sweep over them enumerates once (:mod:`runner.plan.torchrec_adapter.enumeration_reuse`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, Mapping, Tuple

ANSWER, RECORD, SWEEP = "answer", "record", "sweep"

# key (or a group: all its keys) -> role; the longest entry that is the key or a prefix of it decides.
ROLES: Dict[str, str] = {
    "mode": ANSWER,
    "model": ANSWER,
    "model.name": RECORD,
    "sharding": ANSWER,
    "sharding.name": RECORD,
    "optimizer": ANSWER,
    "optimizer.name": RECORD,
    "cluster": ANSWER,
    "cluster.name": RECORD,
    "precision": ANSWER,
    "precision.name": RECORD,
    "data": ANSWER,
    "train": ANSWER,
    "tracking": RECORD,
    "tracking.objective": SWEEP,
    "sweep": SWEEP,
    "calibrate": ANSWER,
}

NOT_ENUMERATED = (
    "sharding.storage_reserve_percent", "sharding.storage_reserve_policy", "sharding.storage_reserve_gib",
    "sharding.storage_reserve_home_gib", "sharding.storage_reserve_dense_multiplier",
    "sharding.storage_reserve_base_gib", "sharding.storage_reserve_overhead_gib", "sharding.proposer",
    "sharding.balanced_work", "sharding.balanced_patience", "sharding.balanced_gap", "sharding.balanced_compare",
    "sharding.dp_hbm_bins", "sharding.grid_max_proposals",
    "sharding.planner_timeout_s", "sharding.plan",
    "cluster.intra_node_bandwidth", "cluster.cross_node_bandwidth", "cluster.master_addr", "cluster.master_port",
    "cluster.node_rank", "cluster.pg_timeout_s", "cluster.max_restarts", "cluster.start_method",
    "cluster.cpu_affinity", "cluster.scheduler", "cluster.gloo_loop_priority",
)

ROLE_NOTES = {RECORD: "recording only: not part of the answer", SWEEP: "steers the sweep: not part of the answer"}


def role(key: str) -> str:
    """The role of ``key`` (dotted); a key the table does not name (an experiment's own) counts as ``answer``."""
    parts = key.split(".")
    return next((ROLES[p] for n in range(len(parts), 0, -1) if (p := ".".join(parts[:n])) in ROLES), ANSWER)


def answer(config: Mapping[str, Any], drop: Tuple[str, ...] = (), prefix: str = "") -> Dict[str, Any]:
    """A resolved config (plain dicts) with only its ``answer`` keys (groups walked), less those in ``drop``: equal
    for two jobs of the same config."""
    out: Dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if key in drop:
            continue
        if isinstance(v, Mapping) and key != "sharding.constraints":  # not a group: one key's value (per table)
            sub = answer(v, drop, f"{key}.")
            if sub or role(key) == ANSWER:
                out[k] = sub
        elif role(key) == ANSWER:
            out[k] = v
    return out


def config_hash(config: Mapping[str, Any]) -> str:
    """:func:`answer`, hashed (tag ``runner.config_hash`` of every job's run)."""
    return hashlib.sha256(json.dumps(answer(config), sort_keys=True, default=str).encode()).hexdigest()[:16]


def enumerated(config: Mapping[str, Any]) -> Dict[str, Any]:
    """:func:`answer` without ``NOT_ENUMERATED``: what TorchRec's enumeration of sharding options reads."""
    return answer(config, NOT_ENUMERATED)
