"""One job, from Hydra's call (:mod:`.run_job`) to its end: an attempt carried out (:mod:`.driver`), what its
MLflow run and what it records (:mod:`.job_run`), a plan-only job (:mod:`.plan_only`), and its run's end (:mod:`.end`)
from its one outcome (:mod:`.outcome`)."""
