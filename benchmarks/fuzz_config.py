"""``make fuzz-config``: configs drawn at random from the schema, each run as a plan-only job and a 3-step training
job, and their outcomes sorted. Not part of ``make test``.

    make fuzz-config ARGS="--count 200 --seed 7"
    python3 benchmarks/fuzz_config.py [--count N] [--seed S] [--only plan|train] [--out outputs/fuzz-config]

A config is every group's option drawn at random (``conf/``; the GPU cluster presets only for plan-only jobs,
the data sources that need files of the user's left out) and a few keys of the schema set to values at or near
their bounds (0, 1, -1, a tenth and ten times the default, huge), plus, now and then, a table named with odd
characters. Each outcome is one of:

- ``done``: exit 0;
- ``refused``: exit 2 with one line ``error: ...`` before anything starts;
- ``failed``: a non-zero exit with one line ``error: ...`` naming a cause;

and anything else is a **finding**: an ``unexpected error``, a traceback on the terminal, more than one error
line, a process of the job left running, or a job that ran past its time. Findings are printed with the command
that replays them (the seed is printed too) and written to ``<out>/findings.json``; exit 1 when there is any.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
PY = ROOT / ".venv" / "bin" / "python"
TRAIN_CLUSTERS = ("local", "2node")
NO_FILES = ("parquet", "criteo")  # data sources that read the user's files: drawn by other tests
ODD_NAMES = ("user.age", "a/b", "../x", "é", "x" * 120, "t 1", "-x", "_ok", "ok-2")
SKIP_KEYS = ("tracking.", "sweep.", "train.resume", "train.checkpoint.dir", "data.path", "data.eval_path",
             "sharding.plan", "cluster.master_addr", "cluster.master_port", "cluster.node_rank", "mode",
             "cluster.scheduler", ".name", "model.tables", "sharding.constraints", "train.steps",
             "cluster.nodes", "cluster.workers_per_node", "data.write_", "model.tasks")


def group_options() -> Dict[str, List[str]]:
    conf = ROOT / "conf"
    return {g.name: sorted(p.stem for p in g.glob("*.yaml")) for g in conf.iterdir()
            if g.is_dir() and g.name not in ("hydra", "experiment")}


def numeric_keys() -> List[Tuple[str, str]]:
    sys.path.insert(0, str(ROOT))
    from runner.config.keydocs import key_docs
    from runner.config.schema import RunnerConfig

    out = []
    for key, default, _doc in key_docs(RunnerConfig):
        if any(s in key for s in SKIP_KEYS):
            continue
        try:
            float(default)
        except (TypeError, ValueError):
            continue
        out.append((key, default))
    return out


def edge_values(default: str) -> List[str]:
    d = float(default)
    ints = float(d).is_integer() and "." not in default
    values = [0, 1, -1, d * 10, d / 10 if d else 0.5, 10**9 if ints else 1e30]
    return [str(int(v)) if ints and float(v).is_integer() else repr(float(v)) for v in values]


def draw(rng: random.Random, mode: str, options: Dict[str, List[str]], keys: List[Tuple[str, str]]) -> List[str]:
    args = []
    for group, names in sorted(options.items()):
        if group == "cluster" and mode == "train":
            names = [n for n in names if n in TRAIN_CLUSTERS]
        if group == "data":
            names = [n for n in names if n not in NO_FILES]
        args.append(f"{group}={rng.choice(names)}")
    for key, default in rng.sample(keys, k=rng.randint(0, 3)):
        args.append(f"{key}={rng.choice(edge_values(default))}")
    if rng.random() < 0.15:
        args.append(f"model.tables=[{{name:'{rng.choice(ODD_NAMES)}',num_embeddings:{rng.choice([1, 7, 1000])}}}]")
    if mode == "train":
        args += ["train.steps=3", "train.log_every=1", "data.eval_batches=1", "train.checkpoint.enabled=false"]
    else:
        args += ["mode=plan"]
    return args


def _left(marker: str) -> List[int]:
    import psutil

    me = {p.pid for p in psutil.Process().children(recursive=True)}
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "environ"]):
        try:
            if p.pid not in me and marker in " ".join(p.info["cmdline"] or []):
                found.append(p.pid)
        except (psutil.Error, TypeError):
            continue
    return found


def run_one(args: List[str], folder: Path, timeout: float) -> Tuple[str, str]:
    """The outcome (done, refused, failed, or a finding's kind) and the line that says it."""
    run_folder = folder / "run"
    cmd = [str(PY), "-m", "runner", *args, f"tracking.uri=sqlite:///{folder / 'mlflow.db'}",
           f"hydra.run.dir={run_folder}"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        subprocess.run(["pkill", "-KILL", "-f", str(run_folder)], check=False)
        return "finding: ran past its time", f"no end within {timeout:.0f} s"
    time.sleep(0.5)
    left = _left(str(run_folder))
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    said = errors[0] if errors else (proc.stdout.strip().splitlines() or [""])[-1]
    if left:
        subprocess.run(["kill", "-9", *map(str, left)], check=False)
        return "finding: process left", f"{len(left)} process(es) of the job after it ended; {said}"
    if "unexpected error" in proc.stdout + proc.stderr:
        return "finding: unexpected error", said
    if "Traceback" in proc.stdout + proc.stderr:
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1:] or ["?"]
        return "finding: traceback", tail[0][:300]
    if proc.returncode == 0:
        return "done", said
    if len(errors) != 1:
        return "finding: not one error line", f"exit {proc.returncode}, {len(errors)} error lines; {said}"
    return ("refused" if proc.returncode == 2 else "failed"), said


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=200, help="configs (each run in every mode asked for)")
    ap.add_argument("--seed", type=int, default=None, help="default: drawn, and printed for a replay")
    ap.add_argument("--only", choices=("plan", "train"), default=None)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a job may take")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "fuzz-config")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    rng = random.Random(seed)
    options, keys = group_options(), numeric_keys()
    modes = [args.only] if args.only else ["plan", "train"]
    out = args.out.resolve() / str(seed)
    print(f"[fuzz-config] seed {seed}: {args.count} configs x {', '.join(modes)} ({len(keys)} numeric keys, "
          f"groups {', '.join(f'{g} ({len(o)})' for g, o in sorted(options.items()))}); folders under {out}",
          flush=True)
    counts: Dict[str, int] = {}
    findings: List[Dict[str, Any]] = []
    start = time.monotonic()
    for i in range(args.count):
        for mode in modes:
            drawn = draw(rng, mode, options, keys)
            folder = out / f"{i:04d}-{mode}"
            folder.mkdir(parents=True, exist_ok=True)
            kind, line = run_one(drawn, folder, args.timeout)
            counts[kind] = counts.get(kind, 0) + 1
            if kind.startswith("finding"):
                findings.append({"kind": kind, "line": line, "args": drawn, "folder": str(folder)})
                print(f"[fuzz-config] FINDING {kind}: {line}\n  replay: python -m runner "
                      + " ".join(f"'{a}'" if any(c in a for c in " [{'") else a for a in drawn), flush=True)
        if (i + 1) % 5 == 0 or i + 1 == args.count:
            print(f"[fuzz-config] {i + 1}/{args.count} configs, {time.monotonic() - start:.0f} s: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
    return finish("fuzz-config", out, seed, counts, findings, f"{sum(counts.values())} jobs")


def finish(tag: str, out: Path, seed: int, counts: Dict[str, int], findings: List[Dict[str, Any]], what: str) -> int:
    """A fuzzer's end (this one's, ``make fuzz-data``'s and ``make fuzz-files``'): ``findings.json`` in ``out``, the
    summary line, and its exit code (1 with a finding)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "findings.json").write_text(json.dumps({"seed": seed, "counts": counts, "findings": findings}, indent=1))
    print(f"[{tag}] seed {seed}: {what}, {len(findings)} finding(s) ({out / 'findings.json'})", flush=True)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
