"""Hydra-composed runner for sharded TorchRec training, logged to MLflow."""

import os
import sys
import time
from pathlib import Path

STARTED = time.time()
"""When this package was first imported: ``python -m runner``'s start, for start-up measurements."""

PROJECT_ROOT = Path(os.environ.get("RUNNER_HOME", Path(__file__).resolve().parents[1]))
"""Folder holding conf/, outputs/ and the default MLflow store (override with $RUNNER_HOME)."""

PLUGINS = str(Path(__file__).resolve().parent / "launch" / "plugins")
"""Where the runner's Hydra launcher and sweepers live (package ``hydra_plugins.runner_launcher``: Hydra finds
plugins only in its ``hydra_plugins`` namespace). On the import path whenever the runner is imported, and on
``PYTHONPATH`` for the processes it starts (a joblib or Slurm job may unpickle a plugin before it imports the
runner), so that a plain ``pip install -e .`` needs nothing more."""
if PLUGINS not in sys.path:
    sys.path.append(PLUGINS)
if PLUGINS not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), PLUGINS]))

__version__ = "0.1.0"
