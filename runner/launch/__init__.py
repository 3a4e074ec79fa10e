"""Launching: a command's jobs from their composed configs to their recorded outcomes.

Its folders are the four things it does:

- :mod:`.job`: one job's life: its attempts, its run folder and MLflow run, planning or training, and its one
  outcome (:mod:`.job.outcome`), recorded in ``status.json`` and the run alike;
- :mod:`.processes`: this host's torch elastic agents, started (ahead of the config, too), supervised and
  stopped, leaving nothing behind;
- :mod:`.schedulers`: where a job's nodes run: on this host, or as a Slurm job; everything that depends on the
  scheduler is behind :class:`.schedulers.Scheduler`;
- :mod:`.sweep`: a command's points: the pre-check, the sweep's parent run, its stop after failures, progress,
  report, resume, the points planned together.

:mod:`.torchrun` is the entry point of a plain ``torchrun`` (no driver); :mod:`.plugins` holds the runner's Hydra
plugins. It is the only stage that imports the others: ``train`` (what the agents run), ``plan``
(``mode=plan``, a sweep planned together), ``data`` (checks before launch, ``mode=write_data``), ``track`` and
``config``. Only :mod:`runner.cli` imports it.
"""
