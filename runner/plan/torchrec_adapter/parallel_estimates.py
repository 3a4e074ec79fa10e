"""TorchRec's estimators over thousands of sharding options, on both cores.

Each option's estimates depend on that option alone (TorchRec's perf and storage estimators read its shards'
sizes and its table, and write its shards' ``perf`` and ``storage``, and the option's ``is_weighted``). At 5,384
tables on 1,024 GPUs the 32,304 options' estimates take about 4 s of a 6-s enumeration, at 20,000 tables 20 s,
while the other core waits. :func:`estimate` forks the planning process (where a fork is safe and a core is
spare: :func:`runner.runtime.cores.may_fork`); the fork estimates the later half of the options and sends back
whatever the estimators set on each option and shard (every attribute whose value changed, as it is: the same
objects' copies, whatever the TorchRec release sets); this process estimates the earlier half and then sets
what the fork sent. Where the fork fails or dies, the later half is estimated here. The numbers are TorchRec's
either way (``tests/plan/test_compact_enumeration.py`` compares both paths with TorchRec's own enumeration).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

from torchrec.distributed.planner.types import ShardEstimator, ShardingOption

from runner.runtime.cores import may_fork
from runner.runtime.process_end import fork_answer, give_up, helper_answer

CHUNK = 2000  # options estimated between two progress reports
FORK_MIN_OPTIONS = 4000  # fewer: estimated here (a fork and the answers' pickling would cost more than half)
FORKED: List[int] = []  # options estimated in a fork, per estimate that forked (read by a test)
Changes = List[Tuple[Dict[str, Any], List[Dict[str, Any]]]]  # per option: its changed attributes, its shards'


def estimate(estimators: List[ShardEstimator], options: List[ShardingOption], inputs: Dict[str, Any],
             progress: Optional[Callable[[Dict[str, Any]], None]] = None, fork_min: Optional[int] = None) -> None:
    """TorchRec's ``estimators`` over ``options`` (``inputs``: their keyword arguments), a chunk at a time,
    ``progress`` told how far between chunks; the later half in a fork where there are ``fork_min``
    (:data:`FORK_MIN_OPTIONS`) options or more."""
    t0 = time.perf_counter()

    def said(done: int) -> None:
        if progress is not None:
            progress({"phase": "estimating", "done": done, "of": len(options), "seconds": time.perf_counter() - t0})

    fork_min = FORK_MIN_OPTIONS if fork_min is None else fork_min
    half = len(options) // 2 if len(options) >= fork_min and may_fork() else len(options)
    helper = _start(estimators, options[half:], inputs) if half < len(options) else None
    if helper is None:  # (no fork: every option here)
        half = len(options)
    try:
        _in_chunks(estimators, options[:half], inputs, said)
    except BaseException:
        if helper is not None:  # its answer is not wanted: ended and reaped now, its pipe closed
            give_up(*helper)
        raise
    if helper is None:
        return
    later = options[half:]
    changes = _collect(*helper)
    if changes is None or len(changes) != len(later):  # the fork failed: estimated here
        _in_chunks(estimators, later, inputs, lambda done: said(half + done))
        return
    FORKED.append(len(later))
    for option, (attrs, shards) in zip(later, changes, strict=True):
        option.__dict__.update(attrs)
        for shard, shard_attrs in zip(option.shards, shards, strict=True):
            shard.__dict__.update(shard_attrs)
    said(len(options))


def _in_chunks(estimators: List[ShardEstimator], options: List[ShardingOption], inputs: Dict[str, Any],
               said: Optional[Callable[[int], None]] = None) -> None:
    """The estimators over ``options``, a chunk at a time, ``said`` told how many are done after each chunk."""
    for start in range(0, len(options), CHUNK):
        chunk = options[start:start + CHUNK]
        for estimator in estimators:
            estimator.estimate(chunk, **inputs)
        if said is not None:
            said(start + len(chunk))


def _changed(before: Dict[str, Any], after: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in after.items() if k not in before or before[k] is not v}


def _start(estimators: List[ShardEstimator], options: List[ShardingOption], inputs: Dict[str, Any]
           ) -> Optional[Tuple[int, int]]:
    def work() -> Changes:  # in the fork: the options' estimates, then what they changed, sent once at the end
        before = [(dict(o.__dict__), [dict(s.__dict__) for s in o.shards]) for o in options]
        _in_chunks(estimators, options, inputs)
        return [(_changed(b, o.__dict__), [_changed(bs, s.__dict__) for bs, s in zip(shards, o.shards, strict=True)])
                for (b, shards), o in zip(before, options, strict=True)]

    try:
        return fork_answer(work)
    except OSError:
        return None


def _collect(pid: int, answer: int) -> Optional[Changes]:
    return cast(Optional[Changes], helper_answer(pid, answer, lambda: None, "the estimating process"))
