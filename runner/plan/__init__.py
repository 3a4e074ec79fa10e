"""Planning: a sharding plan for a model on a cluster, and what it is expected to cost.

Owns the topology TorchRec's planner sees (built from the cluster config, bandwidths and memory caps
converted in one place), the storage reservation, per-table constraints and proposers from the sharding
policy, the sharders offered to DistributedModelParallel, plan files (JSON written by every run, pinned
plans read back), the analysis of a plan (per-rank estimates, balance, traffic within and across nodes,
the chart), and the ``plan/`` report every run writes. Planning is a pure step: config and a model on
the meta device in, plan and estimates out, no worker process needed; ``mode=plan``'s orchestration
(reporting a plan-only job to its run) is :mod:`runner.launch.job.plan_only`. It imports only
:mod:`runner.config` and :mod:`runner.runtime`; never ``track``, ``train``, ``data`` or ``launch`` (the
caller builds the model and reports).
"""
