"""TorchRec's greedy proposers at the scale of hundreds of tables, with TorchRec's answers.

``sharding.proposer=greedy`` is TorchRec's ``[GreedyProposer(), GreedyProposer(use_depth=False)]``: each
proposes from every table's options sorted by perf, and after each proposal moves the table whose current
option holds the most storage to its next option. Without a threshold (TorchRec's default) that sequence
ignores the feedback: the proposals and their order are fixed. TorchRec's planner partitions every
proposal, keeping the first with the strictly lowest rating over both proposers in order.

:class:`SkippingGreedyProposer` hands the planner the same proposals in the same order, less those that
cannot change its answer, for the same reasons and with the same arithmetic as the dynamic-programming
proposer's skips (:class:`.dp_proposer.SkippingProposer`): a shard that fits no device, a proposal TorchRec's
greedy partitioner must fail, or one whose rating cannot be strictly below the best so far. Skipped
proposals still advance their proposer (its feedback only moves to the next). The planner's loop is the
runner's (:mod:`.planning_loop`). ``tests/plan/test_greedy.py`` compares plans and estimates with TorchRec's
own planner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import numpy as np
from torchrec.distributed.planner.proposers import GreedyProposer
from torchrec.distributed.planner.types import ShardingOption

from runner.plan.torchrec_adapter.dp_proposer import SkippingProposer

if TYPE_CHECKING:
    from torchrec.distributed.planner.types import Enumerator

    from runner.config.schema import ShardingSchema


class SkippingGreedyProposer(SkippingProposer):
    """TorchRec's two greedy proposers as one stream of proposals (the first's, then the second's), less
    those that cannot change the planner's answer (see the module doc)."""

    name = "greedy"

    def __init__(self, world_size: int, exact_partitioner: bool = True) -> None:
        self.chain = [GreedyProposer(), GreedyProposer(use_depth=False)]
        super().__init__(self.chain[0], world_size, exact_partitioner)  # type: ignore[arg-type]
        self._at = 0
        self._index: Dict[int, Tuple[int, int]] = {}  # id(option) -> (table, option) in the facts' order

    def load(self, search_space: List[ShardingOption], enumerator: Optional[Enumerator] = None) -> None:
        super().load(search_space, enumerator)
        for proposer in self.chain[1:]:  # TorchRec's planner loads every proposer before proposing
            proposer.load(search_space, enumerator)
        self._at = 0
        tables = self.chain[0]._sharding_options_by_fqn
        self._order = {fqn: t for t, fqn in enumerate(tables)}
        self._index = {id(option): (t, o) for t, options in enumerate(tables.values())
                       for o, option in enumerate(options)}

    def _options(self, proposal: List[ShardingOption]) -> np.ndarray:
        picks = np.empty(len(self._order), dtype=np.int64)
        for option in proposal:
            t, o = self._index[id(option)]
            picks[t] = o
        return picks

    def propose(self) -> Optional[List[ShardingOption]]:
        while self._at < len(self.chain):
            proposer = self.chain[self._at]
            proposal = proposer.propose()
            if proposal is None:
                self._at += 1
                continue
            if self.facts is not None and self._skip_options(self._options(proposal)):
                proposer.feedback(partitionable=False, plan=proposal, storage_constraint=self._constraint)
                continue
            return proposal
        return None

    def _proposing(self) -> GreedyProposer:
        # feedback goes to the proposer proposing; the facts' (table, option) order is the first one's (``inner``)
        return self.chain[self._at]


def build(sharding: ShardingSchema, device_type: str, world_size: int) -> SkippingGreedyProposer:
    """``sharding.proposer=greedy``: TorchRec's two greedy proposers, less what cannot change their answer."""
    return SkippingGreedyProposer(world_size)
