"""``hydra/sweeper=optuna``: the runner's Optuna sweeper, on Optuna's own API (Optuna 5; conf/hydra/sweeper/).

- **Samplers**: ``hydra/sweeper/sampler=tpe`` (default), ``random``, ``cmaes``, ``nsgaii`` (multi-objective),
  ``grid``; any of their keys under ``hydra.sweeper.sampler``. **Directions**: ``hydra.sweeper.direction`` is
  ``minimize``/``maximize``, or a list of them for a multi-objective study (each job returns
  ``tracking.objective.metric`` then ``tracking.objective.more_metrics``); its Pareto front is printed and kept.
- **No plan fits** (a plan-only point): the trial carries the violated constraint ``plan_fits`` (Optuna 5's
  ``set_constraint``), so the sampler learns the feasible region; the summary counts such trials apart from failed.
- **The study** lives in Optuna's journal storage in the sweep folder (:mod:`runner.launch.sweep.study`; any
  Optuna storage URL in ``hydra.sweeper.storage`` instead); study name ``hydra.sweeper.study_name``, else
  ``runner``.
- **Asynchronous trials**: with ``hydra.sweeper.n_jobs`` > 1 and a launcher that runs jobs outside this process
  (``hydra/launcher=joblib``, ``slurm``), up to ``n_jobs`` trials run at once and a new one is asked for as soon
  as any one ends (``hydra.sweeper.batch=true``: Hydra's way, ``n_jobs`` at a time, each batch waiting for its
  slowest). With Hydra's basic launcher trials run one after the other, in this process.
- **Resume** (``python -m runner resume <sweep folder>``, or the same command with the same
  ``hydra.sweep.dir``): the study goes on from its journal, its definition unchanged (``keep_or_refuse``).
  A trial the stop interrupted (still RUNNING there) runs again with its own values in its own job folder (job
  number = trial number; the sweep's other overrides as kept with it, in one attribute, or the command's where
  the stop came between asking for it and keeping them) and its result is told to it; finished trials count
  toward ``n_trials``, so the study runs only the trials it still lacks, numbered on from the last (a seeded
  sampler seeded with its seed plus the number of trials there, so that it does not draw its first run's values
  again).
"""

from __future__ import annotations

import logging
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union, cast

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:
    import optuna
    from hydra.core.utils import JobReturn

DEFAULT_STUDY = "runner"
IN_PROCESS = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
STOP_WAIT_S = 60.0  # how long a stopped study waits for its running trials to stop
OVERRIDES_ATTR = "runner.overrides"  # a trial's user attribute: the sweep's overrides beside its sampled values
log = logging.getLogger(__name__)


class OptunaSweeper(Sweeper):
    def __init__(self, sampler: Any, direction: Union[str, Sequence[str]], study_name: Optional[str],
                 storage: Optional[str], n_trials: int, n_jobs: int, max_failure_rate: float,
                 params: Optional[Dict[str, Any]], batch: bool = False, pruner: Any = None) -> None:
        self.sampler, self.pruner = sampler, pruner
        self.directions = [direction] if isinstance(direction, str) else [str(d) for d in direction]
        self.study_name = study_name or DEFAULT_STUDY
        self.storage = storage
        self.n_trials, self.n_jobs = int(n_trials), max(int(n_jobs), 1)
        self.max_failure_rate = float(max_failure_rate)
        self.params, self.batch = dict(params or {}), bool(batch)
        self.job_idx = 0
        self.trial_file: Optional[Path] = None
        self.stopped = False  # too many trials failed: none asked for any more
        self.config: Optional[DictConfig] = None
        self.launcher: Any = None

    @property
    def _folder(self) -> Path:
        """The sweep folder (``hydra.sweep.dir``)."""
        assert self.config is not None
        return Path(str(self.config.hydra.sweep.dir))

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    # -- the study --------------------------------------------------------------------------------------------
    def _study(self, space: Dict[str, Any]) -> Any:
        import functools

        import optuna

        from runner.launch.sweep.study import journal_storage, write_trial_file

        assert self.config is not None
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # its INFO lines on stderr; the runner says its own
        folder = self._folder
        storage = self.storage or journal_storage(folder)
        if isinstance(self.sampler, functools.partial):  # the grid sampler: its grid is the search space
            from runner.launch.sweep.study import refuse
            ranged = [k for k, d in space.items() if not hasattr(d, "choices")]
            if ranged:
                refuse(f"hydra/sweeper/sampler=grid tries every value of choice(...) keys; {', '.join(ranged)} "
                       "is an interval or range: give it as choice(...), or use another sampler")
            self.sampler = self.sampler(search_space={k: list(d.choices) for k, d in space.items()})
        study = optuna.create_study(study_name=self.study_name, storage=storage, sampler=self.sampler,
                                    pruner=self.pruner, directions=cast(Any, self.directions), load_if_exists=True)
        from runner.launch.sweep.study import keep_or_refuse  # a changed one refused before any trial
        keep_or_refuse(study, self.config.hydra.sweeper, self.config.tracking.objective, str(self.config.mode),
                       space, str(self.storage or folder))
        self.trial_file = write_trial_file(folder, storage, self.study_name,
                                           OmegaConf.select(self.config, "hydra.sweeper.pruner"))
        trials = study.get_trials(deepcopy=False)
        if trials:
            seed = OmegaConf.select(self.config, "hydra.sweeper.sampler.seed")
            if seed is not None and not isinstance(self.sampler, optuna.samplers.GridSampler):
                from hydra.utils import instantiate

                # a seeded sampler would draw its first run's values again: seeded on from the trials it has
                study.sampler = instantiate(self.config.hydra.sweeper.sampler, seed=int(seed) + len(trials))
        return study

    def sweep(self, arguments: List[str]) -> None:
        import optuna

        from runner.launch.sweep.study import search_space

        space, fixed = search_space(self.params, arguments)
        study = self._study(space)
        trials = study.get_trials(deepcopy=False)
        stale = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
        if trials:
            where = self.storage or self._folder
            print(f"[runner] optuna study {self.study_name!r} resumed from {where}: {len(trials)} trial(s) "
                  f"there ({len(stale)} interrupted, run again); {max(0, self.n_trials - len(trials))} more to run",
                  flush=True)
        for frozen in stale:  # its running trial again, to record its constraint on (Optuna has no public door)
            trial = optuna.trial.Trial(study, frozen._trial_id)
            self._tell(study, trial, self._launch([self._overrides(frozen.params, _kept_overrides(frozen, fixed),
                                                                 frozen.number)], frozen.number)[0])
        self.job_idx = len(trials)
        todo = max(0, self.n_trials - len(trials))
        assert self.config is not None
        in_process = str(OmegaConf.select(self.config, "hydra.launcher._target_")) == IN_PROCESS
        if self.n_jobs > 1 and in_process:
            print(f"[runner] optuna: hydra.sweeper.n_jobs={self.n_jobs} with Hydra's basic launcher runs one trial "
                  f"at a time, in this process; hydra/launcher=joblib hydra.launcher.n_jobs={self.n_jobs} runs "
                  f"{self.n_jobs} at once", flush=True)
        if self.pruner is not None and OmegaConf.select(self.config, "train.checkpoint.every_steps") is None:
            print("[runner] optuna: a training trial reports to the pruner at its checkpoints; with "
                  "train.checkpoint.every_steps=null it has none before its end and is never pruned", flush=True)
        slots = 1 if in_process else self.n_jobs
        how = "one at a time" if slots == 1 else f"{slots} at a time, in batches" if self.batch else \
            f"up to {slots} at once, a new one as any ends"
        print(f"[runner] optuna: {todo} trial(s), {how}; sampler {type(study.sampler).__name__}, pruner "
              f"{type(self.pruner).__name__ if self.pruner is not None else 'none'}, {' x '.join(self.directions)}; "
              f"study {self.study_name!r} in {self.storage or self._folder}", flush=True)
        if self.batch:
            self._batches(study, space, fixed, todo, slots)
        else:
            self._asynchronous(study, space, fixed, todo, slots)
        from runner.launch.sweep.study import write_results

        write_results(study, self.directions, self._folder)

    def _overrides(self, params: Dict[str, Any], fixed: Dict[str, Any], number: int) -> List[str]:
        from runner.launch.sweep.study import trial_overrides

        told = [] if self.trial_file is None else [f"tracking.objective.study={self.trial_file}",
                                                   f"tracking.objective.trial={number}"]
        return trial_overrides(params, {str(k): str(v) for k, v in fixed.items()}) + told

    def _ask(self, study: optuna.Study, space: Dict[str, Any], fixed: Dict[str, str]) -> Any:
        trial = study.ask(fixed_distributions=space)
        # kept with the trial, so that a resumed study reruns it as it was: in one write, whole or not at all
        trial.set_user_attr(OVERRIDES_ATTR, dict(fixed))
        return trial

    def _launch(self, batch: List[List[str]], first: int) -> List[Any]:
        return list(self.launcher.launch(batch, initial_job_idx=first))

    def _tell(self, study: optuna.Study, trial: optuna.Trial, ret: JobReturn) -> bool:
        """Tell a trial's result (the job's return value) with whether its plan fits (``study.mark_fit``: a
        plan-only point where none fits is a violated constraint, not a result); a job that raised fails its
        trial. True when it completed."""
        import optuna

        from runner.launch.sweep.study import job_values, mark_fit
        from runner.runtime import run_files

        number = trial.number
        ended = run_files.read_json(self._folder / str(number) / run_files.STATUS) or {}
        if ended.get("status") == "KILLED":  # stopped or never run (the sweep stopped): left RUNNING, for resume
            return True
        try:
            if ended.get("status") == "FAILED":
                raise RuntimeError(str(ended.get("error") or "the job failed"))
            values = job_values(ret.return_value, len(self.directions))
        except Exception as exc:  # noqa: BLE001  (the trial fails, the study goes on)
            self._told(study, number, state=optuna.trial.TrialState.FAIL)
            log.warning(f"Failed experiment: {exc}")
            return False
        mark_fit(trial, self._folder / str(number))
        self._told(study, number, values=values if len(values) > 1 else values[0])
        return True

    def _told(self, study: optuna.Study, number: int, **result: Any) -> None:
        try:
            study.tell(number, skip_if_finished=True, **result)  # a pruned trial's job told it PRUNED itself
        except RuntimeError as exc:  # the result is stored; the grid sampler's grid is done (it asks to stop)
            if "Study.stop" not in str(exc):
                raise
            if not self.stopped:
                print(f"[runner] optuna: every point of the grid sampler's grid has been tried ({number + 1} trials): "
                      "no more trials", flush=True)
            self.stopped = True

    def _failed_too_often(self, told: List[bool]) -> bool:
        """Whether no more trials are asked for: too many failed, the grid is done, or the sweep was stopped
        (``sweep.max_failures``: ``stop.json``)."""
        from runner.launch.sweep.stop import stop_reason

        if not self.stopped and stop_reason(self._folder):
            self.stopped = True
        failed = told.count(False)
        if self.stopped or not failed or failed / len(told) <= self.max_failure_rate:
            return self.stopped
        self.stopped = True
        print(f"[runner] optuna: {failed} of {len(told)} trials failed, above hydra.sweeper.max_failure_rate="
              f"{self.max_failure_rate}: no more trials", flush=True)
        return True

    def _batches(self, study: optuna.Study, space: Dict[str, Any], fixed: Dict[str, str], todo: int,
                 slots: int) -> None:
        """Hydra's way: ``slots`` trials asked, launched together, all waited for, then the next batch."""
        told: List[bool] = []
        while todo > 0 and not self._failed_too_often(told):
            trials = [self._ask(study, space, fixed) for _ in range(min(slots, todo))]
            rets = self._launch([self._overrides(t.params, fixed, t.number) for t in trials], self.job_idx)
            told += [self._tell(study, t, r) for t, r in zip(trials, rets, strict=True)]
            self.job_idx += len(trials)
            todo -= len(trials)

    def _asynchronous(self, study: optuna.Study, space: Dict[str, Any], fixed: Dict[str, str], todo: int,
                      slots: int) -> None:
        """Up to ``slots`` trials at once, each launched alone; a new one asked for as soon as any ends (the
        asking and telling here, in this thread; a pool thread only waits on its job)."""
        if slots == 1:
            return self._batches(study, space, fixed, todo, 1)
        told: List[bool] = []
        running: Dict[Future, Any] = {}
        pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="runner-trial")
        try:
            while todo > 0 or running:
                while todo > 0 and len(running) < slots and not self._failed_too_often(told):
                    trial = self._ask(study, space, fixed)
                    batch = [self._overrides(trial.params, fixed, trial.number)]
                    running[pool.submit(self._launch, batch, trial.number)] = trial
                    self.job_idx, todo = trial.number + 1, todo - 1
                if not running:
                    break
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in done:
                    trial = running.pop(future)
                    told.append(self._tell(study, trial, _first(future)))
        except BaseException as exc:
            if running:
                self._stop_running(exc, list(running))
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _stop_running(self, exc: BaseException, running: List[Future]) -> None:
        """This process was stopped (Ctrl-C, SIGTERM) or failed while trials ran elsewhere: they are told to stop
        too, as a sweep stopped by ``sweep.max_failures`` stops its running points (``stop.json``: each ends
        KILLED, its workers stopped; a scheduler's points not started yet cancelled), and waited for a while."""
        from runner.launch.sweep.stop import stop_sweep
        from runner.runtime.signals import Stopped

        name = exc.name if isinstance(exc, Stopped) else "SIGINT" if isinstance(exc, KeyboardInterrupt) else \
            type(exc).__name__
        stop_sweep(self._folder, f"stopped by {name}")
        print(f"[runner] optuna: stopped by {name}; the {len(running)} running trial(s) stop too", flush=True)
        wait(running, timeout=STOP_WAIT_S)


def _kept_overrides(frozen: optuna.trial.FrozenTrial, fixed: Dict[str, str]) -> Dict[str, Any]:
    """The overrides an interrupted trial ran with beside its sampled values: as kept with it; where they were not
    (the sweep was stopped between asking for the trial and keeping them), this command's, said in one line.
    A study kept by an earlier runner holds them one attribute per key, which may be cut short in the same way:
    this command's fill in what it lacks."""
    kept = frozen.user_attrs.get(OVERRIDES_ATTR)
    if isinstance(kept, dict):
        return kept
    if not frozen.user_attrs:
        print(f"[runner] optuna: trial {frozen.number} was interrupted before its overrides were kept with it: it "
              "runs again with this command's", flush=True)
    return {**fixed, **frozen.user_attrs}


def _first(future: Future) -> Any:
    """The job return of a one-job launch; a launch that raised gives a return that raises (its trial fails)."""
    try:
        return future.result()[0]
    except Exception as exc:  # noqa: BLE001
        return _Raised(exc)


class _Raised:
    """A job return whose value is the launch's exception, raised when read."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    @property
    def return_value(self) -> Any:
        raise self.exc
