"""The job's description, and the vocabulary every stage shares.

Owns the typed schema Hydra composes onto (every key with its unit, default and range) and its read-only
form while a job runs, the checks a composed config must pass, the model's tables as plain data, where a job
runs (:mod:`.place`), every proposer declared once (:mod:`.proposers`), and the names every stage uses: the
error kinds and their one-line messages (:mod:`.errors`). The choice of device and backend, GPUs and memory
caps is ``runtime``'s (:mod:`runner.runtime.device`). It is the bottom of the package: it imports nothing from the other
stages (``runtime``, ``launch``, ``plan``, ``train``, ``data``, ``track``), and nothing here imports
torch at module level. Process plumbing (signals, run folder files, log files, cores) is ``runtime``'s.
"""
