"""A training job that is a trial of an Optuna study with a pruner (``hydra/sweeper/pruner=median|hyperband``):
at each checkpoint's evaluation (``train.checkpoint.every_steps``) rank 0 reports the objective metric to the
trial (Optuna's ``Trial.report``) and asks the study's pruner; every rank gets the answer, and a pruned trial
stops training there, marked PRUNED in the study, its run FINISHED with the tag ``runner.pruned_at_step``.

The sweeper writes what a trial needs (its storage, study name and pruner) to ``optuna_trial.yaml`` in the sweep
folder and names it and the trial in each trial's overrides (``tracking.objective.study`` and ``.trial``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

if TYPE_CHECKING:
    import torch

    from runner.config.schema import ObjectiveSchema

TRIAL_FILE = "optuna_trial.yaml"


class TrialPruning:
    """The pruning of one trial's training, for the loop's checkpoints; inactive where the job is no such trial."""

    def __init__(self, o: ObjectiveSchema, mode: str, rank: int, device: Optional[torch.device] = None) -> None:
        from runner.track.objective import objective

        self.file, self.number, self.rank, self.device = o.study, o.trial, rank, device  # NCCL: the GPU's tensor
        self.metric = objective(o, mode)[0]
        self.active = bool(self.file) and self.number is not None and not o.more_metrics
        self._trial: Any = None
        self.pruned_value: Optional[float] = None

    def _open(self) -> Any:
        import optuna
        from hydra.utils import instantiate
        from omegaconf import OmegaConf

        study_file: Any = OmegaConf.load(str(self.file))
        storage = study_file.storage
        if str(storage).startswith(("sqlite:", "postgresql", "mysql")):
            storage = optuna.storages.RDBStorage(str(storage))
        else:
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend

            storage = JournalStorage(JournalFileBackend(str(storage)))
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        pruner = instantiate(study_file.pruner) if study_file.get("pruner") else None
        study = optuna.load_study(study_name=str(study_file.study), storage=storage, pruner=pruner)
        assert self.number is not None  # Optuna's storage API names a trial by its id, the sweeper by its number
        trial_id = storage.get_trial_id_from_study_id_trial_number(
            storage.get_study_id_from_name(str(study_file.study)), int(self.number))
        return optuna.trial.Trial(study, trial_id)

    def should_stop(self, step: int, metrics: Dict[str, float]) -> bool:
        """Report ``metrics``' objective at ``step`` (rank 0) and whether the pruner stops the trial there (every
        rank, the same answer). The pruned trial is told PRUNED here; the sweeper leaves it so."""
        if not self.active:
            return False
        import torch
        import torch.distributed as dist

        decision = torch.zeros(1, device=self.device)
        value = metrics.get(self.metric)
        if self.rank == 0 and value is not None and value == value:
            try:
                decision[0] = self._ask(step, float(value))
            except Exception as exc:  # noqa: BLE001 - the study's storage away: this trial trains on, unpruned
                print(f"[runner] warning: Optuna's pruner not asked at step {step} ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''}); the trial trains on", flush=True)
        if dist.is_initialized() and dist.get_world_size() > 1:  # every rank, whatever rank 0 met
            dist.broadcast(decision, 0)
        return bool(decision[0])

    def _ask(self, step: int, value: float) -> bool:
        """Rank 0: report ``value`` at ``step``; whether the pruner stops the trial (then told PRUNED here)."""
        import optuna

        self._trial = self._trial or self._open()
        self._trial.report(value, step)
        if not self._trial.should_prune():
            return False
        self._trial.study.tell(self._trial.number, state=optuna.trial.TrialState.PRUNED)
        self.pruned_value = value
        return True
