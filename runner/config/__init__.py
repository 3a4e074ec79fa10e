"""The job's description, and the vocabulary every stage shares.

Owns the typed schema Hydra composes onto (every key with its unit, default and range), the checks a
composed config must pass, the model's tables as plain data, and the names every stage uses: the error
kinds and their one-line messages (:mod:`.errors`) and the choice of device and backend, GPUs and
memory caps (:mod:`.device`). It is the bottom of the package: it imports nothing from the other
stages (``runtime``, ``launch``, ``plan``, ``train``, ``data``, ``track``), and nothing here imports
torch at module level. Process plumbing (signals, run folder files, log files, cores) is ``runtime``'s.
"""
