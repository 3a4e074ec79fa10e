"""``make compat``: every supported stack (``requirements/stacks.toml``) built on this CPU machine and checked.

    make compat                          # every stack
    make compat ARGS="torchrec-1.9"      # some
    python3 benchmarks/compat.py [--out outputs/compat] [STACK ...]

Per stack, in its own venv (:mod:`stacks`: FBGEMM's CPU build, the registry's torch), with an MLflow store and
run folders under ``<out>/<stack>/`` and a fresh cache for the planner's conformance verdict:

- ``imports``: every FBGEMM and TorchRec module the runner names imports there, and each moved name is found;
- ``planner``: which planner a job gets (the runner's, on the tested TorchRec or one that passes the conformance
  check, run here; TorchRec's stock planner only where a name it relies on is gone), and that this is right;
- ``identity``: the TorchRec-named proposers and the compact enumeration against TorchRec's own
  (``runner.launch.conformance_check``; n/a where the stock planner plans: its plans are TorchRec's);
- ``plan``: a plan-only job, 1,000 tables on 128 GPUs with the runner's planner (100 on 16 with the stock one,
  which takes over 20 minutes at the larger size);
- ``train``: a 2-rank training job (loss, AUC, a checkpoint); ``resume``: a job resumed from that checkpoint;
- ``types``: a sweep training every sharding type; ``optimizers``: a sweep training every sparse optimizer
  FBGEMM's CPU build runs;
- ``sweep``: a 4-point plan-only sweep (bandwidth x storage reserve).

Prints one table (stack x check) and writes ``<out>/report.md``; exit 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stacks import ROOT, Stack, build_env, load_stacks  # noqa: E402

Outcome = Tuple[bool, str]
WIDE = ["model.embedding_dim=256", "model.dense_arch_layer_sizes=[256]"]  # real column splits
SHORT = ["train.steps=10", "train.log_every=5", "train.batch_size=128", "data.eval_batches=2"]

_IMPORTS = """
import ast, importlib, pathlib
from runner.runtime import moved_names as moved
names = set()
for path in pathlib.Path('runner').rglob('*.py'):
    if path.name == "moved_names.py":
        continue
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split('.')[0] in ('torchrec', 'fbgemm_gpu'):
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split('.')[0] in ('torchrec', 'fbgemm_gpu'))
gone = []
for n in sorted(names):
    try:
        importlib.import_module(n)
    except ImportError as exc:
        gone.append(f'{n} ({exc})')
for f in (moved.cache_algorithm, moved.multipass_prefetch_config, moved.weight_decay_mode):
    f()
print(f'{len(names)} modules import' if not gone else 'missing: ' + ', '.join(gone))
raise SystemExit(1 if gone else 0)
"""
_PLANNER = """
from runner.plan.torchrec_adapter import torchrec_seam as seam
gone, stock, passed = seam.missing(), seam.seam_note(), seam.conformance_note()
right = (stock is None) == (not gone)  # the stock planner only where a relied-on name is gone
if stock:
    print("TorchRec's stock planner: " + stock.split(": planned")[0])
else:
    print("the runner's: " + ("conformance check passed" if passed else "the TorchRec it was tested with"))
raise SystemExit(0 if right else 1)
"""


class Checker:
    """One stack's checks, each a command in the stack's venv; outputs under ``out``."""

    def __init__(self, stack: Stack, python: Path, out: Path) -> None:
        self.stack, self.python, self.out = stack, python, out
        self.store = f"sqlite:///{out / 'mlflow.db'}"
        self.env = {**os.environ, "XDG_CACHE_HOME": str(out / "cache"), "CUDA_VISIBLE_DEVICES": "",
                    "PYTHONWARNINGS": "ignore"}
        self.stock = False

    def run(self, name: str, args: List[str], timeout: float = 900) -> Tuple[int, str]:
        log = self.out / f"{name}.log"
        with log.open("w") as f:
            try:
                code = subprocess.run([str(self.python), *args], cwd=ROOT, env=self.env, stdout=f,
                                      stderr=subprocess.STDOUT, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                code = 124
        return code, log.read_text()

    def job(self, name: str, *overrides: str, sweep: bool = False, timeout: float = 900) -> Tuple[int, str]:
        folder = self.out / name
        where = f"hydra.sweep.dir={folder}" if sweep else f"hydra.run.dir={folder}"
        return self.run(name, ["-m", "runner", *(["-m"] if sweep else []), *overrides, f"tracking.uri={self.store}",
                               f"tracking.experiment=compat-{name}", where], timeout)

    def imports(self) -> Outcome:
        code, text = self.run("imports", ["-c", _IMPORTS])
        return code == 0, _last(text)

    def planner(self) -> Outcome:
        code, text = self.run("planner", ["-c", _PLANNER])
        self.stock = _last(text).startswith("TorchRec's stock")
        return code == 0, _last(text)

    def identity(self) -> Outcome:
        if self.stock:
            return True, "n/a: the stock planner plans (TorchRec's own answers)"
        code, text = self.run("identity", ["-m", "runner.launch.conformance_check"])
        line = _last(text)
        if code == 0 and "(" in line:  # the figures only: the full line is in identity.log
            return True, "TorchRec's answers (" + line.rsplit("(", 1)[1]
        return code == 0, line

    def plan(self) -> Outcome:
        tables, nodes = (100, 2) if self.stock else (1000, 16)
        start = time.monotonic()
        code, text = self.job("plan", "mode=plan", "experiment=plan_many_tables",
                              f"model.generated_tables.count={tables}", "cluster=gpu_4x8", f"cluster.nodes={nodes}")
        took = time.monotonic() - start
        if code != 0:
            return False, _last(text)
        results = json.loads((self.out / "plan" / "results.json").read_text())
        step = results.get("est_step_ms")
        return True, f"{tables} x {nodes * 8}: {took:.0f} s, estimated step {_ms(step)}"

    def train(self) -> Outcome:
        code, text = self.job("train", *SHORT, "train.steps=20")
        if code != 0:
            return False, _last(text)
        r = json.loads((self.out / "train" / "results.json").read_text())
        ok = r.get("checkpoint") is not None and 0 < r["final_loss"] < 2
        return ok, f"loss {r['final_loss']:.4f}, AUC {r['eval_auc']:.4f}, {r['samples_per_s']:.0f} samples/s"

    def resume(self) -> Outcome:
        source = json.loads((self.out / "train" / "results.json").read_text()).get("checkpoint")
        if not source:
            return False, "no checkpoint to resume from"
        code, text = self.job("resume", *SHORT, "train.steps=30", f"train.resume={source}")
        if code != 0:
            return False, _last(text)
        r = json.loads((self.out / "resume" / "results.json").read_text())
        return r.get("start_step") == 20, f"resumed at step {r.get('start_step')}, loss {r['final_loss']:.4f}"

    def _sweep(self, name: str, *overrides: str, points: int) -> Outcome:
        code, text = self.job(name, *overrides, sweep=True)
        done = [d for d in (self.out / name).iterdir() if d.is_dir() and (d / "status.json").exists()
                and json.loads((d / "status.json").read_text())["status"] == "FINISHED"]
        return code == 0 and len(done) == points, f"{len(done)} of {points} points finished" + (
            "" if code == 0 else f": {_last(text)}")

    def types(self) -> Outcome:
        options = "tablewise,rowwise,columnwise,tablerowwise,tablecolumnwise,gridshard,dataparallel"
        return self._sweep("types", *SHORT, *WIDE, "train.checkpoint.enabled=false", f"sharding={options}",
                           points=7)

    def optimizers(self) -> Outcome:
        return self._sweep("optimizers", *SHORT, "train.checkpoint.enabled=false",
                           "optimizer=sgd_sgd,adagrad_adamw,rowwise_adagrad_adam", points=3)

    def sweep(self) -> Outcome:
        return self._sweep("sweep", "mode=plan", "cluster=gpu_2x8", "cluster.cross_node_bandwidth=5,20",
                           "sharding.storage_reserve_percent=0.1,0.3", points=4)


CHECKS: Dict[str, Callable[[Checker], Outcome]] = {
    "imports": Checker.imports, "planner": Checker.planner, "identity": Checker.identity, "plan": Checker.plan,
    "train": Checker.train, "resume": Checker.resume, "types": Checker.types, "optimizers": Checker.optimizers,
    "sweep": Checker.sweep,
}


def _last(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(("WARNING", "  "))]
    errors = [ln for ln in lines if ln.startswith("error:")]
    return (errors or lines or ["no output"])[-1][:300]


def _ms(value: object) -> str:
    return f"{value:.3f} ms" if isinstance(value, (int, float)) else "?"


def check_stack(stack: Stack, out: Path) -> Dict[str, Tuple[bool, str, float]]:
    folder = out / stack.name
    if folder.exists():
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    folder.mkdir(parents=True)
    try:
        python = build_env(stack)
    except RuntimeError as exc:
        return {name: (False, f"environment: {exc}" if name == "imports" else "not run", 0.0) for name in CHECKS}
    checker, found = Checker(stack, python, folder), {}
    for name, check in CHECKS.items():
        start = time.monotonic()
        try:
            ok, text = check(checker)
        except Exception as exc:  # noqa: BLE001  (a check's own failure is that check's outcome)
            ok, text = False, f"{type(exc).__name__}: {exc}"
        found[name] = (ok, text, time.monotonic() - start)
        print(f"[compat] {stack.name} {name}: {'ok' if ok else 'FAILED'} ({found[name][2]:.0f} s) {text}", flush=True)
    return found


def report(stacks: List[Stack], results: Dict[str, Dict[str, Tuple[bool, str, float]]], seconds: float) -> str:
    head = "| check | " + " | ".join(f"{s.name} ({s.versions()})" for s in stacks) + " |"
    rows = [head, "|" + "---|" * (len(stacks) + 1)]
    for name in CHECKS:
        cells = [f"{'ok' if results[s.name][name][0] else '**FAILED**'}: {results[s.name][name][1]}" for s in stacks]
        rows.append(f"| {name} | " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    failed = sum(not ok for r in results.values() for ok, _, _ in r.values())
    rows.append("")
    rows.append(f"{len(stacks)} stack(s), {failed} failed check(s), {seconds / 60:.1f} min "
                f"({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores)")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stacks", nargs="*", help="stack names (default: every stack of requirements/stacks.toml)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "compat")
    args = parser.parse_args()
    known = load_stacks()
    unknown = [s for s in args.stacks if s not in known]
    if unknown:
        print(f"error: stack {unknown[0]!r} is not allowed; expected one of {', '.join(known)}", file=sys.stderr)
        return 2
    stacks = [known[s] for s in args.stacks] if args.stacks else list(known.values())
    out = args.out.resolve()
    start = time.monotonic()
    results = {s.name: check_stack(s, out) for s in stacks}
    table = report(stacks, results, time.monotonic() - start)
    (out / "report.md").write_text(table + "\n")
    print(table)
    print(f"[compat] report: {out / 'report.md'}")
    return 0 if all(ok for r in results.values() for ok, _, _ in r.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
