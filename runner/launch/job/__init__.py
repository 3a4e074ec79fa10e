"""One job, from Hydra's call (:mod:`.hydra_call`) to its end: an attempt carried out (:mod:`.driver`), what its
MLflow run records (:mod:`.run_record`), a plan-only job (:mod:`.plan_only`), and its run's end (:mod:`.end`)
from its one outcome (:mod:`.outcome`)."""
