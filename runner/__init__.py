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
plugins only in its ``hydra_plugins`` namespace). On the import path whenever the runner is imported (the
command, its agents and workers, a Slurm task), so that a plain ``pip install -e .`` needs nothing more."""
if PLUGINS not in sys.path:
    sys.path.append(PLUGINS)

__version__ = "0.1.0"
