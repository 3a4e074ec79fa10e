"""Shared helpers: run the real CLI in a subprocess and read the real MLflow store back."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, List

# `make test` runs the suite in two processes (pytest-xdist). Each is a host of its own for what the runner
# shares through the temporary folder (joblib jobs' core slots): set before the runner is imported.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _tmp = Path(tempfile.gettempdir()) / f"runner-tests-{os.environ['PYTEST_XDIST_WORKER']}"
    _tmp.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(_tmp)
    tempfile.tempdir = None

# Calibrations (cluster.calibration=auto) are looked for in a folder of the suite's own, empty unless a test makes
# one: a calibration the developer made on this machine never changes what the suite's plans are compared with.
# Taken away when the process that made it ends (each pytest process makes its own; a child forked from it that
# ends through its interpreter leaves it).
os.environ["RUNNER_CALIBRATION_DIR"] = _CALIBRATIONS = tempfile.mkdtemp(prefix="runner-calibrations-")
atexit.register(lambda made_by=os.getpid(): os.getpid() == made_by and shutil.rmtree(_CALIBRATIONS, True))

import pytest  # noqa: E402

from runner.runtime.device import cuda_present  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# The suite is a CPU suite on any host: a GPU host's GPUs are hidden from it and from every process it starts
# (CUDA_VISIBLE_DEVICES="", read by torch and the runner through NVML: nothing initialises CUDA here), so that
# the end-to-end tests run as on CPU (gloo, forked workers) instead of being refused or switched to NCCL. The
# tests marked gpu see the host's GPUs again (the autouse fixture below).
HOST_CUDA = cuda_present()
HOST_GPUS = os.environ.get("CUDA_VISIBLE_DEVICES")
os.environ["CUDA_VISIBLE_DEVICES"] = ""


@pytest.fixture(autouse=True)
def _host_gpus_for_gpu_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("gpu") is not None:
        if HOST_GPUS is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", HOST_GPUS)

# Small and quick: few steps, small batches. Every end-to-end test starts from these.
FAST = ["train.steps=30", "train.log_every=10", "train.batch_size=128", "data.eval_batches=4"]


# The files that take longest, longest first (their walls in a 2-process `make test` on 2026-11-26, 235 s down to
# 30 s): handed out first, so that the two processes end together instead of one finishing a long file alone.
LONGEST = ["slurm/test_slurm.py", "faults/test_faults.py", "track/test_sweeps.py", "track/test_optuna.py",
           "train/test_checkpoints.py",
           "train/test_sharding_e2e.py", "train/test_training_options.py", "faults/test_tracking_outage.py",
           "faults/test_sync_races.py", "faults/test_chaos.py",
           "track/test_remote_tracking.py", "launch/test_launch.py", "data/test_data.py", "test_e2e.py",
           "track/test_store.py", "plan/test_search.py"]


def _order(item: pytest.Item) -> tuple:
    path = item.path.relative_to(ROOT / "tests").as_posix()
    return (LONGEST.index(path) if path in LONGEST else len(LONGEST), item.get_closest_marker("slow") is None)


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    """Under ``make test`` (pytest-xdist, whole files per process) the longest files first (:data:`LONGEST`:
    the Slurm file, whose tests mostly wait on Slurm, before all), then the other files with slow tests,
    then the quick ones, which fill the end."""
    items.sort(key=_order)


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite MLflow store for the session (each test uses its own experiment)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def cfg_for(*overrides: str):
    """The config ``python -m runner OVERRIDES`` composes (Hydra's own ``compose`` on conf/), validated."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import runner.cli  # noqa: F401  (schema and resolvers)
    from runner.config.validation import validate

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    validate(cfg)
    return cfg


def run_cli(args: List[str], timeout: float = 300, tag: str | None = None,
            env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m runner ARGS`` as a user runs it; ``tag`` marks every descendant's environment."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", RUNNER_TEST_TAG=tag or uuid.uuid4().hex)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "runner", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout)


_PROGRESS = re.compile(r"^\s*\w+:\s+\d+%\|[^\]]*\]")  # rank 0's progress bar, maybe not ended by a newline


def stderr_lines(text: str) -> List[str]:
    """The non-empty lines of a job's stderr without the progress bar (tqdm redraws it with carriage
    returns, and an error line may follow it on the same line)."""
    segments = (_PROGRESS.sub("", ln) for ln in re.split(r"[\r\n]", text))
    return [ln for ln in segments if ln.strip()]


def to_the_background(pid: int) -> None:
    """Every thread of ``pid`` at nice 19 (niceness is per thread on Linux: torch's and gloo's threads too): a
    rank that only trains until the test's event (a time limit, a server back) leaves the cores to the rest."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(task.name), 19)
        except OSError:  # a thread that ended
            pass


def processes_tagged(tag: str) -> List[int]:
    """Live processes whose environment carries ``RUNNER_TEST_TAG=tag`` (orphans of a job)."""
    pids = []
    needle = f"RUNNER_TEST_TAG={tag}".encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0"):
                status = (d / "status").read_text()
                if "\nState:\tZ" not in status:
                    pids.append(int(d.name))
        except OSError:
            continue
    return pids


def runs(uri: str, experiment: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r} in {uri}"
    return client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def metric_history(uri: str, run_id: str, key: str) -> List[float]:
    from mlflow.tracking import MlflowClient

    hist = MlflowClient(uri).get_metric_history(run_id, key)
    return [m.value for m in sorted(hist, key=lambda m: m.step)]


def finished_run(store: str, experiment: str, run_folder: Path, args: List[str], **kwargs) -> tuple:
    """Run ``python -m runner ARGS`` into its own MLflow experiment and folder; it must succeed.
    Returns the process and the experiment's one MLflow run."""
    proc = run_cli([*args, f"tracking.uri={store}", f"tracking.experiment={experiment}", f"hydra.run.dir={run_folder}"],
                   **kwargs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = runs(store, experiment)
    return proc, run


class MlflowServer:
    """A real ``mlflow server`` on 127.0.0.1 (SQLite backend, local artifacts), stoppable and restartable
    on the same port and store."""

    def __init__(self, folder: Path) -> None:
        from runner.launch.processes.ports import free_port

        self.port, self.folder = free_port(), folder
        self.url, self.artifacts = f"http://127.0.0.1:{self.port}", folder / "artifacts"
        self.proc: subprocess.Popen | None = None

    def start(self, within: float = 180) -> float:
        """Start and wait until it answers; the seconds it took."""
        import time
        import urllib.request

        t0 = time.monotonic()
        mlflow_bin = Path(sys.executable).parent / "mlflow"
        self.proc = subprocess.Popen(
            [str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{self.folder / 'server.db'}", "--artifacts-destination",
             str(self.artifacts)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            # tracking only: MLflow 3's job execution (on by default with a SQLite store) starts ~8 more Python
            # processes per server, which the tests never use and which share the 2 cores with what they time
            env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            assert self.proc.poll() is None, "mlflow server exited"
            assert time.monotonic() - t0 < within, "mlflow server did not come up"
            time.sleep(0.3)

    def stop(self, sig: int = 9) -> None:
        """Stop it and its workers: SIGKILL (a crashed server; also the quick end a test needs: the server
        takes about 7 s to stop on SIGTERM), or ``sig``."""
        import signal

        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass
        self.proc = None


_CHROMIUM_TRIED: List[bool] = []


def _chromium() -> str | None:
    """Headless Chromium's path. Where there is none and this runs as root, Debian's package is installed first
    (`make chromium`, once per test process), as the Slurm tests install Slurm."""
    import shutil

    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.geteuid() == 0 and not _CHROMIUM_TRIED:
        _CHROMIUM_TRIED.append(True)
        try:  # apt-get's steps have 300 s each in the recipe
            subprocess.run(["make", "-s", "chromium"], cwd=ROOT, capture_output=True, timeout=960)
        except (OSError, subprocess.TimeoutExpired):
            pass  # skipped below, saying so
        found = shutil.which("chromium") or shutil.which("chromium-browser")
    return found


def ui_text(url: str) -> str:
    """The text a browser shows for ``url`` (MLflow's React UI, rendered by headless Chromium); skips, saying so,
    where there is no Chromium and it cannot be installed (not root, or apt-get could not)."""
    browser = _chromium()
    if browser is None:
        pytest.skip("needs Chromium to render the MLflow UI: none found, and " + (
            "`make chromium` could not install Debian's package" if os.geteuid() == 0
            else "installing it needs root (`make chromium`)"))
    proc = subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=15000",
                           "--dump-dom", url], capture_output=True, text=True, timeout=120)
    html = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", proc.stdout, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


FORKSERVER_PRELOAD = ["runner.train.worker", "runner.cli", "runner.track.sync"]


def forkserver() -> Any:
    """multiprocessing's fork server context: processes forked from one process of their own that imported the
    stack once (:data:`FORKSERVER_PRELOAD`) and runs no threads, never from the test process. A test process has
    threads (pytest-xdist's, a server being started, an earlier test's rendezvous or MLflow client), and a child
    forked while one of them holds a lock (an import's, a connection pool's) waits on it for good: in a whole suite a
    forked child hung that way and held its job until the suite's time ran out."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)  # read once, when the server first starts
    return ctx


def elastic_in_process(run_folder: Path, name: str) -> Any:
    """Two gloo workers on the runner's worker entry for the resolved config in ``run_folder``, started by torch
    elastic's ``elastic_launch`` from this test's process tree (through :func:`forkserver`), as TorchRec's golden
    example tests itself: each rank's results. Raises torch elastic's ``ChildFailedError`` when a rank fails."""
    import signal

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from runner.launch.processes.ports import free_port
    from runner.train.worker import elastic_entry

    forkserver()
    launch = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=name, rdzv_backend="c10d",
                          rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0, monitor_interval=0.2,
                          start_method="forkserver")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    try:
        return elastic_launch(launch, elastic_entry)(str(run_folder))
    finally:  # torch elastic installs its own stop handlers in this process
        for s, h in handlers.items():
            signal.signal(s, h)


def launch_in_process(cfg, run_folder: Path, uri: str, name: str):
    """A 2-rank job of ``cfg`` in this test's own process tree (:func:`elastic_in_process`): its resolved config
    written to ``run_folder``, its MLflow run opened here (as the driver does). Returns ``({rank: results}, run id,
    the MlflowRun)``; the caller ends the run."""
    from omegaconf import OmegaConf

    from runner.runtime import run_files
    from runner.track.mlflow_run import MlflowRun

    run_folder.mkdir()
    OmegaConf.save(cfg, run_folder / run_files.RESOLVED, resolve=True)
    mlflow_run = MlflowRun(run_folder, uri)
    run_id = mlflow_run.open(cfg.tracking.experiment, OmegaConf.to_container(cfg, resolve=True), name, None, {})
    return elastic_in_process(run_folder, name), run_id, mlflow_run
