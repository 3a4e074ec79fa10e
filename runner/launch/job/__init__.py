"""One job's life: Hydra's call (:mod:`.life`), an attempt carried out (:mod:`.driver`), its MLflow run
(:mod:`.mlflow_run`), a plan-only job (:mod:`.plan_only`), and its end (:mod:`.end`) from its one outcome
(:mod:`.outcome`)."""
