"""The runner's own proposer, ``sharding.proposer=balanced``: the plan whose busiest rank has the least estimated
work, its choice of options and their placement searched together on TorchRec's own numbers, and the lower bound
on any plan's estimated step. The problem and its search (:mod:`.problem`, :mod:`.moves`, :mod:`.exact`) work on
numbers and import nothing of TorchRec's; :mod:`.proposer` and :mod:`.balanced_planner` put them in TorchRec's planner.

- :mod:`.problem`: the problem on numbers: placement rules, TorchRec's rating, a first plan.
- :mod:`.moves`: the local search from a plan, and ruin and recreate around its optimum.
- :mod:`.exact`: branch and bound over every option and placement, for small problems.
- :mod:`.proposer`: TorchRec's options as the problem, the search from its starts, the report's note.
- :mod:`.balanced_planner`: the planner: TorchRec's reservation, enumeration, rating and plan around the search.
- :mod:`.bound`: the lower bound on any plan's estimated step (mean rank, largest shard, an LP relaxation, whole
  shards), computed in a fork beside the search where a core is idle.

``tests/plan/test_balanced.py`` checks them; docs/planning.md describes the search.
"""
