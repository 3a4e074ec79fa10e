"""The conformance check of the installed TorchRec against the runner's planner (what
:mod:`runner.plan.torchrec_adapter.conformance` runs once per stack, in a subprocess of its own).

On a small built-in problem (24 tables of several sizes on 2 x 8 GPUs, every GPU kernel): the compact enumeration
equal to TorchRec's own enumerator and estimators shard by shard (size, offset, storage, perf), then each
TorchRec-named proposer's plan and per-rank estimates equal to TorchRec's planner with its own proposer (grid
search on 3 tables, where TorchRec's searches every combination). About 5 s here.

``python -m runner.launch.conformance_check`` prints the outcome in one line (exit 1 on a difference).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, List, Tuple, cast

from runner.config.proposers import PROPOSERS
from runner.plan import CHECKING

_TABLES = 24
_POINT = ("experiment=plan_many_tables", f"model.generated_tables.count={_TABLES}", "cluster=gpu_2x8",
          "sharding.compute_kernels=[]", "+sharding.constraints.g001.cache_load_factor=0.3",
          "cluster.calibration=none")  # TorchRec's own constants: the answers compared are TorchRec's
# the proposers whose plans are TorchRec's, each checked at the extra keys its declaration gives
_PROPOSED = {n: p.check_at for n, p in PROPOSERS.items() if p.torchrecs_answer and p.stock}


def _compose(*overrides: str) -> Any:
    from hydra import compose

    from runner.config.schema import register_schemas
    from runner.config.validation import validate
    from runner.launch.sweep.precheck import hydra_conf

    register_schemas()
    with hydra_conf():
        cfg = compose(config_name="config", overrides=list(overrides))
    validate(cast(Any, cfg))
    return cfg


def _proposer_differences(world: int, local: int, proposers: Tuple[str, ...]) -> List[str]:
    from runner.plan import plan_spec, proposer_differs
    from runner.train.models import planning_model

    out = []
    for name in proposers:
        cfg = _compose(*_POINT, f"sharding.proposer={name}", *_PROPOSED[name])
        if proposer_differs(plan_spec(cfg), planning_model(cfg), world, local):
            out.append(f"the {name} proposer's plan differs from TorchRec's own")
    return out


def failures(proposers: Tuple[str, ...] = tuple(_PROPOSED)) -> List[str]:
    """What differs between the runner's planner and TorchRec's on the built-in problem (the enumeration, then
    each of ``proposers``); empty when nothing."""
    from runner.plan import enumeration_differences, plan_spec
    from runner.train.models import planning_model

    cfg = _compose(*_POINT)
    world, local = cfg.cluster.nodes * cfg.cluster.workers_per_node, cfg.cluster.workers_per_node
    return (enumeration_differences(plan_spec(cfg), planning_model(cfg), world, local)
            or _proposer_differences(world, local, proposers))


def main() -> int:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ[CHECKING] = "1"  # the planners built here are the runner's, whatever the version
    start = time.monotonic()
    try:
        found = failures()
    except Exception as exc:  # noqa: BLE001  (a TorchRec the adapter cannot even drive fails the check)
        found = [f"the runner's planner raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"]
    took = time.monotonic() - start
    if found:
        print(f"conformance check failed: {'; '.join(found)}", flush=True)
        return 1
    print(f"conformance check passed: the compact enumeration and the dynamic_programming, greedy, grid_search and "
          f"uniform proposers give TorchRec's answers ({_TABLES} tables on 16 GPUs, {took:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
