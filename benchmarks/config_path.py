"""How a job's config travels: the runner's modules it passes through from the driver's ``execute_job`` to
rank 0's ``Trainer`` (from the job's start, ``run_job``), and how often that path goes back to a module it had left.

It runs one small training job (``make run``'s model, 2 ranks, 3 steps) with a profiler in each of the
job's processes (a ``sitecustomize`` on ``PYTHONPATH``, active only for this run). A call is on the path when
it is a function of the runner that takes the config, or a part of it, as an argument (an OmegaConf
``DictConfig``). The driver's path starts at ``run_job`` (Hydra's call) and ends where it hands the job to its
agents (the supervisor's ``launch``); the agent's starts at its ``main``; rank 0's starts at ``elastic_entry`` and
ends at ``Trainer.__init__``. Printed for each, and for the path to the trainer they make together: the
modules entered, the moves between modules, the returns (a move into a module the path had already left),
and the modules entered most often; then the same for the driver's whole job (its run opened, fed and
ended while and after the workers train).

    .venv/bin/python benchmarks/config_path.py [--root <a checkout of the runner>]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SITECUSTOMIZE = '''
import atexit, json, os, sys, threading
_OUT = os.environ.get("RUNNER_CONFIG_PATH_OUT")
if _OUT:
    _STARTS = {"run_job": "driver", "main": "agent", "elastic_entry": "rank"}
    _ENDS = {("runner.train.trainer", "__init__")}  # the driver's path goes on to its process's end
    _state = {"role": None, "path": [], "done": False}

    def _write():
        if _state["role"] and _state["path"]:
            name = f"{_state['role']}-{os.getpid()}.json"
            with open(os.path.join(_OUT, name), "w") as f:
                json.dump({"role": _state["role"], "rank": os.environ.get("RANK"), "path": _state["path"]}, f)

    def _profile(frame, event, arg):
        if event != "call" or _state["done"]:
            return
        module = frame.f_globals.get("__name__", "")
        if module == "__main__" and "/runner/" in frame.f_code.co_filename:  # python -m runner.launch.processes.agent
            tail = frame.f_code.co_filename.rsplit("/runner/", 1)[1]
            module = "runner." + tail[:-3].replace("/", ".")
        if not module.startswith("runner"):
            return
        code = frame.f_code
        if _state["role"] is None:
            role = _STARTS.get(code.co_name)
            if role is None or (role == "agent" and not module.endswith(".agent")):
                return
            _state["role"], _state["path"] = role, []
        from omegaconf import DictConfig

        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if any(isinstance(frame.f_locals.get(n), DictConfig) for n in names):
            _state["path"].append([module, code.co_name])
            if (module, code.co_name) in _ENDS:
                _state["done"] = True
                _write()

    def _forked():  # a forked worker starts its own path (its parent's is the agent's)
        _state.update(role=None, path=[], done=False)

    os.register_at_fork(after_in_child=_forked)
    sys.setprofile(_profile)
    threading.setprofile(_profile)
    atexit.register(lambda: None if _state["done"] else _write())
'''


def summarise(path: list) -> dict:
    modules = [m for m, _ in path]
    moves, seen, returns, previous = 0, set(), 0, None
    entered = collections.Counter()
    for m in modules:
        if m == previous:
            continue
        if previous is not None:
            moves += 1
            if m in seen:
                returns += 1
        entered[m] += 1
        seen.add(m)
        previous = m
    return {"modules": len(seen), "moves": moves, "returns": returns, "entered": entered}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(ROOT), help="the checkout whose runner is traced (default: this one)")
    args = parser.parse_args()
    root = Path(args.root).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        hook, out = Path(tmp) / "hook", Path(tmp) / "out"
        hook.mkdir()
        out.mkdir()
        (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = dict(os.environ, RUNNER_CONFIG_PATH_OUT=str(out), PYTHONPATH=f"{root}:{hook}")
        cmd = [sys.executable, "-m", "runner", "train.steps=3", "train.log_every=1", "data.eval_batches=1",
               "train.checkpoint.enabled=false", "tracking.system_metrics=false",
               f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"hydra.run.dir={tmp}/run"]
        proc = subprocess.run(cmd, cwd=root, env=env, text=True, capture_output=True, timeout=600)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        records = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    parts = {r["role"]: r["path"] for r in records if r["role"] != "rank" or r.get("rank") == "0"}
    whole = parts.get("driver", [])
    handoff = next((i + 1 for i, (m, f) in enumerate(whole) if m.endswith(".supervisor") and f == "launch"), len(whole))
    parts["driver"], parts["driver, whole job"] = whole[:handoff], whole
    path = [step for role in ("driver", "agent", "rank") for step in parts.get(role, [])]
    total = summarise(path)
    for role in ("driver", "agent", "rank", "driver, whole job"):
        s = summarise(parts.get(role, []))
        print(f"config-path {role}: calls={len(parts.get(role, []))} modules={s['modules']} moves={s['moves']} "
              f"returns={s['returns']}")
    if os.environ.get("CONFIG_PATH_SHOW"):
        for role in ("driver", "agent", "rank", "driver, whole job"):
            print(role, " > ".join(f"{m.removeprefix('runner.')}.{f}" for m, f in parts.get(role, [])))
    top = ", ".join(f"{m.removeprefix('runner.')} {n}" for m, n in total["entered"].most_common(4))
    whole = summarise(parts["driver, whole job"])
    print("config-path driver, whole job: entered most: " + ", ".join(
        f"{m.removeprefix('runner.')} {n}" for m, n in whole["entered"].most_common(4)))
    print(f"config-path to the trainer: root={root} modules={total['modules']} moves={total['moves']} "
          f"returns={total['returns']} | entered most: {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
