"""A second process for a long search: partitions proposals while this one partitions others.

At a thousand tables on a hundred GPUs nearly every proposal the skips leave must be partitioned (at
1000 x 128: 274 of 275 partitions gave plans, 187 of them better than the best so far), one after the other,
on one core. :class:`PartitionHelper` is a fork of the planning process, made between two partitions, so it
holds the same search space, topology, partitioner and perf model; it is handed proposals (by the options'
identities, the same in both processes after the fork), partitions and rates each with TorchRec's own calls,
and answers ``(index, partitionable, rating)``. The search loop (:mod:`.planning_loop`) keeps the first
strictly best plan in proposal order, as TorchRec's loop does; the helper's winner, if it is one, is
partitioned again here for its shard ranks (the same calls on the same state give the same answer).

The helper ends when the search does, when this process dies, or on Ctrl-C with it; if it fails, the
proposals it still held are partitioned here.
"""

from __future__ import annotations

import contextlib
from multiprocessing.connection import Connection, Pipe
from typing import Dict, List, Optional, Tuple

from torchrec.distributed.planner.types import Partitioner, PerfModel, PlannerError, ShardingOption, Topology
from torchrec.distributed.planner.utils import reset_shard_rank

from runner.runtime.process_end import fork_helper, reap

Answer = Tuple[int, bool, Optional[float]]
ANSWER_TIMEOUT_S = 120.0  # one partition takes well under a second at 1000 tables x 128 GPUs


def rate(partitioner: Partitioner, perf_model: PerfModel, proposal: List[ShardingOption],
         storage_constraint: Topology) -> Optional[float]:
    """TorchRec's partition and rating of one proposal (None: it does not partition). Its shards keep the
    ranks the partitioner gave until the caller resets them."""
    try:
        plan = partitioner.partition(proposal=proposal, storage_constraint=storage_constraint)
    except PlannerError:
        return None
    return perf_model.rate(plan=plan)


def _serve(conn: Connection, options: Dict[int, ShardingOption], partitioner: Partitioner,
           perf_model: PerfModel, storage_constraint: Topology) -> None:
    while True:
        request = conn.recv()
        if request is None:
            return
        index, ids = request
        proposal = [options[i] for i in ids]
        rating = rate(partitioner, perf_model, proposal, storage_constraint)
        reset_shard_rank(proposal)
        conn.send((index, rating is not None, rating))


class PartitionHelper:
    """The forked helper: :meth:`hand` a proposal, :meth:`answers` what it finished, :meth:`close`."""

    def __init__(self, search_space: List[ShardingOption], partitioner: Partitioner,
                 perf_model: PerfModel, storage_constraint: Topology) -> None:
        options = {id(o): o for o in search_space}
        ours, theirs = Pipe()

        def work() -> None:  # the helper; where it fails, the planning process partitions what is left
            ours.close()
            _serve(theirs, options, partitioner, perf_model, storage_constraint)

        pid = fork_helper(work)
        theirs.close()
        self.pid, self.conn = pid, ours
        self.held: Dict[int, List[ShardingOption]] = {}
        self.failed = False

    def hand(self, index: int, proposal: List[ShardingOption]) -> bool:
        """Give it a proposal (False: it is gone, the proposal stays here)."""
        try:
            self.conn.send((index, [id(o) for o in proposal]))
        except OSError:
            self.failed = True
            return False
        self.held[index] = list(proposal)
        return True

    def answers(self, wait: bool = False) -> List[Answer]:
        """What it has finished (``wait``: every proposal it holds). Where it failed (it died, or answered nothing for
        :data:`ANSWER_TIMEOUT_S`), nothing more comes and :attr:`held` keeps the proposals it did not answer."""
        out: List[Answer] = []
        try:
            while self.held and self.conn.poll(ANSWER_TIMEOUT_S if wait else 0):
                answer = self.conn.recv()
                self.held.pop(answer[0])
                out.append(answer)
            if wait and self.held:
                self.failed = True
        except (EOFError, OSError):
            self.failed = True
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if not self.failed:
                self.conn.send(None)
        self.conn.close()
        reap(self.pid, kill=self.failed)
