"""TorchRec's planner made fast, with the same answers: every part of the runner that reaches into TorchRec's
planner, behind one seam.

- :mod:`.torchrec_seam`: every TorchRec private name these parts use, the TorchRec version they were
  tested with, and the fall-back to TorchRec's stock planner on any other version (said in one note line).
- :mod:`.planning_loop`: TorchRec's planning loop without its per-improvement deep copy.
- :mod:`.dp_proposer`: the dynamic-programming proposer, vectorised, skipping proposals that cannot change
  the answer.
- :mod:`.greedy_proposers`: TorchRec's greedy proposers, less the proposals that cannot change the answer.
- :mod:`.record_copies`: deep copies of the planner's shards, storage, perf and devices.
- :mod:`.partition_helper`: a forked second process that partitions proposals of a long search.
- :mod:`.shared_placements`: the partitioner's row-wise and data-parallel placements shared across proposals.
- :mod:`.shard_estimators`: TorchRec's shard estimators with their perf config looked up once.
- :mod:`.enumeration_reuse`: enumerated sharding options shared by the points of a plan-only sweep.

Each is compared with TorchRec's own call at many points (``tests/plan/test_search.py``, ``test_greedy.py``,
``test_reuse.py``); what each buys today is in docs/benchmarks.md.
"""
