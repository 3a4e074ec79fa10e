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

# Hydra's grid sweeper for a sweep the runner's pre-check composed and validated point by point
# (runner/launch/plugins/hydra_plugins/runner_launcher/basic_sweeper.py); the pre-check adds it, the sweep's
# recorded command leaves it out
CHECKED_SWEEPER = "hydra_plugins.runner_launcher.basic_sweeper.CheckedBasicSweeper"
