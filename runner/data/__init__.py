"""Data: where a rank's batches come from.

Owns the sources (synthetic clicks, Parquet folders, Criteo click logs), how their rows are split over
ranks and dataloader workers, the check before launch that a source can be read, the background
prefetch and the all-ranks end check, and writing the synthetic source as Parquet. It imports only
:mod:`runner.config` and :mod:`runner.runtime`; the training stage asks it for batches.
"""
