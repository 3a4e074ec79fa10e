"""Launching: one job from its composed config to its final status.

Owns the driver (run folder, the MLflow run's lifecycle, the summary line), starting, supervising and
stopping this host's torch elastic agents (one per node; emulated nodes on one host), the agent
process itself, and the agent started ahead of the config to overlap imports. It is the only stage
that imports the others: ``train`` (what the agents run), ``plan`` (``mode=plan``), ``data`` (checks
before launch, ``mode=write_data``), ``track`` and ``config``. Only :mod:`runner.cli` imports it.
"""
