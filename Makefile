# `make run`: the main job on the embedded default. `make test`: the test suite.
# Both create .venv with the pinned CPU stack on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: run test lint bench bench-plan bench-tracking clean-outputs mlflow-ui slurm-up slurm-down

$(STAMP): requirements/runtime.txt requirements/lock.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# CPU build of torch from the machine's wheel cache; a CUDA machine follows README's GPU path instead
	$(PY) -m pip install --quiet torch==2.13.0 fbgemm-gpu-cpu==1.8.0
	# the rest before torchrec: pip checks declared dependencies on every resolving install, and torchrec
	# declares the CUDA fbgemm-gpu, which the CPU stack replaces (so it goes in last, with --no-deps)
	$(PY) -m pip install --quiet -r requirements/runtime.txt -c requirements/lock.txt
	$(PY) -m pip install --quiet --no-deps torchrec==1.8.0
	$(PY) -m pip install --quiet --no-deps -e .
	# Hydra finds launcher plugins only in its hydra_plugins namespace: the runner's lives in runner/launch/plugins
	$(PY) -c "import pathlib, site; pathlib.Path(site.getsitepackages()[0], 'runner_hydra_plugins.pth')\
	.write_text('$(CURDIR)/runner/launch/plugins\n')"
	$(PY) -c "import torch, fbgemm_gpu, torchrec, hydra, mlflow; print('environment ready: torch', torch.__version__, \
	'| fbgemm', fbgemm_gpu.__version__, '| torchrec', torchrec.__version__, '| hydra', hydra.__version__, \
	'| mlflow', mlflow.__version__, '|', 'CUDA' if torch.cuda.is_available() else 'CPU')"
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m runner $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)  # no path given: pyproject.toml's testpaths (tests/)

lint: $(STAMP)
	$(VENV)/bin/ruff check runner tests benchmarks

mlflow-ui: $(STAMP)
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db

clean-outputs:
	rm -rf outputs/runs outputs/multirun

bench: $(STAMP)
	$(PY) benchmarks/compare.py $(ARGS)

bench-plan: $(STAMP)
	$(PY) benchmarks/plan_sweep.py $(ARGS)

bench-tracking: $(STAMP)
	$(PY) benchmarks/tracking_rate.py $(ARGS)

# A Slurm of two emulated nodes on this machine (root; installs Debian's packages when missing), for
# hydra/launcher=slurm and the tests marked slurm. slurm-down stops it and leaves nothing running.
slurm-up:
	bash tests/slurm/cluster.sh up

slurm-down:
	bash tests/slurm/cluster.sh down
