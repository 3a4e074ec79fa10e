"""The planner's TorchRec adapter: the one package that reaches into TorchRec's planner internals (private names,
functions TorchRec does not export, a patched method), imported only after the version check.

- :mod:`.torchrec_seam`: every TorchRec private name the adapter uses, the TorchRec version it was tested with, and
  the check (:func:`.torchrec_seam.seam_note`) run before anything else here is imported: on another version, or a
  TorchRec lacking a listed name, :mod:`runner.plan.planner` plans with TorchRec's stock planner and says so in
  one note line. It imports nothing of TorchRec's at module level.
- :mod:`.runner_planner`: the runner's planner, built from the modules below, and its fall-backs.
- :mod:`.compact_enumeration`, :mod:`.enumeration_reuse`, :mod:`.shard_estimators`: TorchRec's enumeration with
  identical shards held once, shared across a sweep, its estimators' config looked up once.
- :mod:`.planning_loop`, :mod:`.dataclass_copies`, :mod:`.shared_placements`, :mod:`.partition_helper`: TorchRec's
  planning loop without its per-improvement deep copies, its placements shared, a second partitioning process.
- :mod:`.dp_proposer`, :mod:`.greedy_proposers`, :mod:`.grid_search`: TorchRec's proposers at scale, with
  TorchRec's answers; :mod:`.balanced` (a package): the runner's own proposer, its search, its planner and the
  lower bound; :mod:`.infeasible`: why no plan fits; :mod:`.reservations`: TorchRec's storage reservations keeping
  host memory free on CPU workers too.

Each speed-up is compared with TorchRec's own call at many points (``tests/plan/test_search.py``,
``test_greedy.py``, ``test_reuse.py``, ``test_compact_enumeration.py``); ``tests/plan/test_torchrec_seam.py``
checks the boundary itself.
"""
