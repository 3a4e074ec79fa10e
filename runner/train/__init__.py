"""Training: one rank's part of a job, from its process group to its results.

Owns the worker process (its rank, device, CPU cores and process group; the error it records when it
fails), the rank's job (model on meta, plan, DistributedModelParallel, optimizers, resume), the models,
the fused sparse and dense optimizers with their schedules, the training loop and the split step
(gradient accumulation and fp16 loss scaling with fused optimizers), evaluation and measurements, and
checkpoints. It imports ``plan`` (to shard the model), ``data`` (for batches), ``track`` (rank 0's
reporter) and ``config``; never ``launch`` or the CLI. Nothing here is imported by ``plan``, ``data`` or
``track``.
"""
