# `make run`: the main job on the embedded default. `make test`: the test suite.
# Both create .venv with the pinned CPU stack on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CUDA_MARK := $(VENV)/.cuda
# The pinned stack (requirements/stacks.toml's `pinned`; a test keeps the two equal)
TORCH_VERSION := 2.14.1
FBGEMM_VERSION := 1.9.0
TORCHREC_VERSION := 1.9.2
# Where a machine without a GPU takes torch's CPU build first; where it does not answer (a quick refusal), pip's
# other indexes (PyPI's Linux torch is the CUDA build: the environment line then says so and what it costs)
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# Where `make gpu-env` takes the CUDA builds of torch and FBGEMM. Empty: PyPI, whose Linux wheels of torch 2.14.1
# and fbgemm-gpu 1.9.0 are both CUDA 13.0 builds (NVIDIA driver 580 or newer). For an older driver, PyTorch's
# index for a CUDA it runs, e.g. TORCH_INDEX=https://download.pytorch.org/whl/cu126 (docs/gpu.md)
TORCH_INDEX ?=
ARGS ?=
# Test processes (pytest-xdist), each given whole test files: the Slurm tests (one file), which mostly wait
# on Slurm, run one after the other in one of them while the other runs the rest. TEST_JOBS=0 runs
# everything in this process.
TEST_JOBS ?= 2
XDIST = $(if $(filter 0,$(TEST_JOBS)),-p no:xdist,-n $(TEST_JOBS) --dist loadfile)

.PHONY: compat fuzz-config fuzz-data fuzz-files gpu-bundle gpu-env gpu-check run test test-fast lint bench bench-plan bench-plan-scale bench-optuna bench-plan-quality bench-estimates bench-tracking bench-store bench-config-path bench-speedups bench-pipelines clean-outputs mlflow-ui slurm-up slurm-down chromium

$(STAMP): requirements/lock.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch's CPU build (PyTorch's CPU index, else pip's own) and FBGEMM's, unless `make gpu-env` made this a CUDA
	# venv (marked by $(CUDA_MARK)): installing fbgemm-gpu-cpu there would overwrite the CUDA build's fbgemm_gpu
	test -f $(CUDA_MARK) || $(PY) -m pip install --quiet --retries 0 --timeout 10 --index-url $(TORCH_CPU_INDEX) \
	torch==$(TORCH_VERSION) 2>/dev/null || $(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	test -f $(CUDA_MARK) || $(PY) -m pip install --quiet fbgemm-gpu-cpu==$(FBGEMM_VERSION)
	# the runner and what pyproject.toml declares (and the test tools), before torchrec: pip checks declared
	# dependencies on every resolving install, and torchrec declares the CUDA fbgemm-gpu, which the CPU stack
	# replaces (so it goes in last, with --no-deps). A .pth left by an earlier Makefile is taken out.
	$(PY) -m pip install --quiet -e ".[test]" -c requirements/lock.txt
	$(PY) -m pip install --quiet --no-deps torchrec==$(TORCHREC_VERSION)
	rm -f $(VENV)/lib/python*/site-packages/runner_hydra_plugins.pth
	# hydra-optuna-sweeper, which an earlier runner installed, registers its own `optuna` sweeper schema, which
	# Hydra then refuses beside the runner's (conf/hydra/sweeper/optuna.yaml): an upgraded venv drops it
	$(PY) -m pip uninstall --quiet --yes hydra-optuna-sweeper 2>/dev/null || true
	$(PY) -c "from runner.runtime.hardware import install_line; print(install_line())"
	touch $(STAMP)

# A CUDA machine: the CUDA builds of torch and FBGEMM, then everything else as `make run` installs it. The
# venv stays CUDA from here on (later `make` runs never install the CPU builds into it).
# An NVIDIA GPU here (the driver's device files, else nvidia-smi): without one, gpu-env and gpu-check stop in one
# line before downloading CUDA builds that would replace the CPU ones for nothing (FORCE=1 builds the CUDA venv anyway;
# `make gpu-check ARGS=--cpu` checks the steps on CPU)
HAS_GPU = $(shell ls /dev/nvidia[0-9]* >/dev/null 2>&1 && echo yes || (nvidia-smi -L 2>/dev/null | grep -q GPU && echo yes))
NO_GPU = { echo "$@: no NVIDIA GPU on this machine (no /dev/nvidia0, no nvidia-smi): it needs one; FORCE=1 builds \
the CUDA environment anyway, make gpu-check ARGS=--cpu checks its steps on CPU (docs/gpu.md)"; exit 1; }

gpu-env:
	@test -n "$(HAS_GPU)$(FORCE)" || $(NO_GPU)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# a CPU build already here (torch 2.14.1+cpu satisfies ==2.14.1) would stay: take both out first
	$(PY) -m pip uninstall --quiet --yes torch fbgemm-gpu-cpu 2>/dev/null || true
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION) fbgemm-gpu==$(FBGEMM_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -c "import torch, sys; sys.exit(0 if torch.version.cuda else 'gpu-env: pip installed a CPU build of torch \
	(' + torch.__version__ + '): set TORCH_INDEX to a CUDA index (docs/gpu.md)')"
	touch $(CUDA_MARK)
	rm -f $(STAMP)
	$(MAKE) $(STAMP)

# A GPU box end to end (docs/gpu.md): the CUDA environment (once), what was found, the GPU tests, runner
# commands over the CUDA path; outputs/gpu-check/report.md is what to send us
gpu-check:
ifneq ($(filter --cpu,$(ARGS)),)
	$(MAKE) $(STAMP)
else
	@test -n "$(HAS_GPU)$(FORCE)" || $(NO_GPU)
	test -f $(CUDA_MARK) || $(MAKE) gpu-env
endif
	$(PY) benchmarks/gpu_check.py $(ARGS)

# Every supported stack (requirements/stacks.toml) built on this CPU machine (.compat/<stack>/) and checked:
# one table of stack x check, exit 1 on a failure (docs/gpu.md). Not part of `make test`.
compat:
	$(PYTHON) benchmarks/compat.py $(ARGS)

# Every wheel a GPU image with torch TORCH and Python PYTHON (a version here, e.g. PYTHON=3.12) lacks, in parts of
# at most PART_MIB MiB for a box with no network (docs/gpu.md); there:
# python3 benchmarks/gpu_bundle.py install --parts <folder of the parts>, then make gpu-check
TORCH ?= 2.11.0
PART_MIB ?= 58
gpu-bundle:
	python3 benchmarks/gpu_bundle.py build --torch $(TORCH) --python $(if $(filter 3.%,$(PYTHON)),$(PYTHON),3.12) \
	--part-mib $(PART_MIB)

run: $(STAMP)
	$(PY) -m runner $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(XDIST) $(ARGS)  # no path given: pyproject.toml's testpaths (tests/)

# The fast tier: every stage in-process (no runner command, no daemon); a change's inner loop
test-fast: $(STAMP)
	$(PY) -m pytest $(XDIST) -m "not slow and not slurm" $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check runner tests benchmarks
	$(VENV)/bin/mypy  # pyproject.toml [tool.mypy]: every module of runner/

mlflow-ui: $(STAMP)
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db

clean-outputs:
	rm -rf outputs/runs outputs/multirun

bench: $(STAMP)
	$(PY) benchmarks/compare.py $(ARGS)

bench-plan: $(STAMP)
	$(PY) benchmarks/plan_sweep.py $(ARGS)

bench-plan-scale: $(STAMP)
	$(PY) benchmarks/plan_scale.py $(ARGS)

# Asynchronous Optuna trials against Hydra's batches: the slots' idle time on trials of uneven length
bench-optuna: $(STAMP)
	$(PY) benchmarks/optuna_async.py $(ARGS)

bench-plan-quality: $(STAMP)
	$(PY) benchmarks/plan_quality.py $(ARGS)

# Estimated against measured steps on held-out training configs, with TorchRec's constants and this machine's
# calibration, and a plan study trained both ways (docs/calibration.md). Not part of `make test`.
bench-estimates: $(STAMP)
	$(PY) benchmarks/estimates.py $(ARGS)

bench-tracking: $(STAMP)
	$(PY) benchmarks/tracking_rate.py $(ARGS)

bench-store: $(STAMP)
	$(PY) benchmarks/store_load.py $(ARGS)

bench-config-path: $(STAMP)
	$(PY) benchmarks/config_path.py $(ARGS)

# Configs drawn at random from the schema, each as a plan-only and a 3-step training job: any unexpected error,
# traceback or process left is printed with its replay command (docs/faults.md). Not part of `make test`.
fuzz-config: $(STAMP)
	$(PY) benchmarks/fuzz_config.py $(ARGS)

# Parquet folders damaged as pipelines damage them, each trained briefly (docs/faults.md); not in make test
fuzz-data: $(STAMP)
	$(PY) benchmarks/fuzz_data.py $(ARGS)

# Every file the runner reads back (calibration, Optuna journal, run and sweep records, plan, checkpoint meta)
# damaged at random and read by the command that reads it (docs/faults.md); not in make test
fuzz-files: $(STAMP)
	$(PY) benchmarks/fuzz_files.py $(ARGS)

bench-speedups: $(STAMP)
	$(PY) benchmarks/speedups.py $(ARGS)

# each training pipeline's samples/s against sparse_dist's, one sweep, with the import floor (on CPU a smoke check)
bench-pipelines: $(STAMP)
	$(PY) benchmarks/pipelines.py $(ARGS)

# A Slurm of two emulated nodes on this machine (root; installs Debian's packages when missing), for
# hydra/launcher=slurm and the tests marked slurm. slurm-down stops it and leaves nothing running.
slurm-up:
	bash tests/slurm/cluster.sh up

slurm-down:
	bash tests/slurm/cluster.sh down

# Headless Chromium (Debian's package; root), for the test that opens the MLflow UI links the runner prints
# (the test runs this itself where there is none and it runs as root; it skips, saying why, where it cannot)
chromium:
	command -v chromium >/dev/null || { [ "$$(id -u)" -eq 0 ] && { timeout 300 apt-get install -y -q \
	--no-install-recommends chromium >/dev/null 2>&1 || { timeout 300 apt-get update -q >/dev/null 2>&1 && \
	timeout 300 apt-get install -y -q --no-install-recommends chromium >/dev/null; }; }; }
