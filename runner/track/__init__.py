"""Tracking: the MLflow side of a job and of a sweep.

Owns where runs go (the store), creating and ending runs with the job's config as params, the path by
which rank 0's metrics, tags and artifacts reach the store (:mod:`.events`: appended to the run folder
by rank 0, written by the driver), what rank 0 reports and prints (:mod:`.reporter`), and a sweep's
parent run, outcome and report (:mod:`runner.launch.sweep.parent`, :mod:`runner.launch.sweep.sweep_report`). It
imports only :mod:`runner.config` and :mod:`runner.runtime`: never ``launch``, ``plan``, ``train`` or ``data``
(what it reports is handed to it as plain data, or read from the run folders).
"""
