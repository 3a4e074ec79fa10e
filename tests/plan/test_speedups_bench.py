"""``make bench-speedups`` turns each of the planner's speed-ups back to TorchRec's (or Python's) own call by patching
the planner's modules: each patch must still fit what it replaces (a changed signature broke the target once), and
the plan with it off must be the plan with it on (speed never changes answers)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_each_speedup_off_plans_the_same() -> None:
    import speedups

    cfg = speedups._config(12, 16)
    _, on_ms = speedups._plan(cfg, 16)
    assert on_ms > 0
    for name in speedups.SPEEDUPS:
        with speedups._off(name):
            _, off_ms = speedups._plan(cfg, 16)
        assert off_ms == on_ms, name
