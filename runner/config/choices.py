"""The values a config key may take, where a type alone cannot say (checked by :mod:`.validation`)."""

SHARDING_TYPES = (
    "data_parallel",
    "table_wise",
    "column_wise",
    "table_column_wise",
    "row_wise",
    "table_row_wise",
    "grid_shard",
)
COMPUTE_KERNELS = ("dense", "fused", "fused_uvm", "fused_uvm_caching", "key_value")
SPARSE_OPTIMIZERS = ("rowwise_adagrad", "adagrad", "sgd", "adam", "lamb", "partial_rowwise_adam",
                     "partial_rowwise_lamb")
SPARSE_OPTIMIZERS_CPU = ("rowwise_adagrad", "adagrad", "sgd")
DENSE_OPTIMIZERS = ("adam", "adamw", "adagrad", "sgd")
SCHEDULES = ("constant", "exp_decay", "steps", "cosine")
AUTOCAST_DTYPES = ("bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
STORAGE_POLICIES = ("heuristic", "fixed")
PROPOSERS = ("default", "dynamic_programming", "greedy", "grid_search", "uniform")
MODES = ("train", "plan", "write_data")
MODEL_FAMILIES = ("dlrm", "dcn", "deepfm", "dnn", "mmoe")
DATA_SOURCES = ("synthetic", "parquet", "criteo")
ONE_WIDTH_FAMILIES = ("dlrm", "dcn", "deepfm")
AFFINITY_MODES = ("auto", "none")
START_METHODS = ("auto", "fork", "spawn")
SCHEDULERS = ("auto", "slurm", "none")

# The runner's sweepers (runner/launch/plugins/hydra_plugins/runner_launcher/), each in place of Hydra's: the
# grid sweeper for a sweep the pre-check composed and validated point by point, the Optuna sweeper whose
# study lives in the sweep folder and resumes. The pre-check names them (hydra.sweeper._target_=...); a
# sweep's recorded command leaves that out.
CHECKED_SWEEPER = "hydra_plugins.runner_launcher.basic_sweeper.CheckedBasicSweeper"
RESUMING_OPTUNA = "hydra_plugins.runner_launcher.optuna_sweeper.ResumingOptunaSweeper"
RUNNER_SWEEPERS = {"hydra._internal.core_plugins.basic_sweeper.BasicSweeper": CHECKED_SWEEPER,
                   "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper": RESUMING_OPTUNA}
