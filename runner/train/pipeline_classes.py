"""The class each training pipeline of :mod:`runner.config.pipelines` trains with: TorchRec's own, or the runner's
subclass a declaration names (``runner_class``) where TorchRec's needs more than its constructor: its unpipelined
step, made pausable like the sparse pipelines (the loop detaches and re-attaches a pipeline around each
checkpoint)."""

from __future__ import annotations

from torchrec.distributed.train_pipeline import TrainPipelineBase, train_pipelines

from runner.config.pipelines import Pipeline
from runner.train.split_step import Unpaused


def pipeline_class(declared: Pipeline) -> type:
    """The class ``declared`` trains with: the runner's subclass it names, else TorchRec's own (the semi-sync and
    lite classes are not exported by TorchRec's package; every class is in its module)."""
    if declared.runner_class is not None:
        return globals()[declared.runner_class]
    return getattr(train_pipelines, declared.torchrec_class)


class PausableBase(TrainPipelineBase, Unpaused):
    """TorchRec's unpipelined step (input dist, forward, backward, step in order), pausable like the sparse
    pipeline."""
