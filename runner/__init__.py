"""Hydra-composed runner for sharded TorchRec training, logged to MLflow."""

import os
import time
from pathlib import Path

STARTED = time.time()
"""When this package was first imported: ``python -m runner``'s start, for start-up measurements."""

PROJECT_ROOT = Path(os.environ.get("RUNNER_HOME", Path(__file__).resolve().parents[1]))
"""Folder holding conf/, outputs/ and the default MLflow store (override with $RUNNER_HOME)."""

__version__ = "0.1.0"
