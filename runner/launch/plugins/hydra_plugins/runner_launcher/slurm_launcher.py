"""``hydra/launcher=slurm``: hydra-submitit-launcher's Slurm launcher, with the runner's submission
(:mod:`runner.launch.schedulers.slurm`): one job per point shaped by its ``cluster``, outcomes from the points'
run folders, Ctrl-C cancels. In a job, each task runs the point as the submitit launcher does."""

from __future__ import annotations

from typing import Any, Sequence

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher


class RunnerSlurmLauncher(SlurmLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        from runner.launch.schedulers.slurm import submit_points

        return submit_points(self, job_overrides, initial_job_idx)
