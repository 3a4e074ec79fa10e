"""``make fuzz-data``: Parquet folders damaged at random, as real pipelines damage them, each trained briefly on
2 CPU ranks, and their outcomes sorted. Not part of ``make test``.

    make fuzz-data ARGS="--count 100 --seed 7"
    python3 benchmarks/fuzz_data.py [--count N] [--seed S] [--steps 3] [--out outputs/fuzz-data]

One clean folder is written first (``python -m runner mode=write_data data=parquet``, 3 training files); each
drawn folder is a copy with one to three damages (:data:`DAMAGES`): a label outside [0, 1] or null, a dense
feature NaN, infinite, null or written as text, an id negative, past its table, null, written as a float or as
text, one file's ids as lists where the others hold one id (or int32 where the others are int64), a column
missing in one file, an empty file, a file that is not Parquet, row groups of a few rows or one of every row.
``data.hash_ids`` is drawn too. Each job's outcome is ``done``, ``refused`` (exit 2, one line) or ``failed``
(one ``error:`` line naming a cause), and anything else is a **finding**, as ``make fuzz-config`` counts them
(an unexpected error, a traceback, more than one error line, a process left, a job past its time), plus
``done`` on data that must stop it (a NaN, a null, a label outside [0, 1], text where numbers go, an id past its
table with ``data.hash_ids=false``). Findings are printed with the folder and the replay command, and written
to ``<out>/<seed>/findings.json``; exit 1 when there is any.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from fuzz_config import PY, finish, run_one  # noqa: E402  (the same outcomes as make fuzz-config)

ROWS = 3000
Damage = Callable[[random.Random, Path, bool], bool]  # (rng, train folder, hash_ids) -> whether it must stop


def _files(folder: Path) -> List[Path]:
    """The folder's Parquet files with rows (another damage may have added an empty one, or one that is not
    Parquet)."""
    import pyarrow.parquet as pq

    found = []
    for path in sorted(folder.glob("*.parquet")):
        try:
            if pq.read_metadata(path).num_rows > 0:
                found.append(path)
        except Exception:  # noqa: BLE001 - not Parquet
            continue
    return found


def _set(path: Path, column: str, make: Callable[[Any, List[Any]], Any]) -> None:
    """Rewrite ``column`` of ``path`` as ``make(pyarrow, its values)`` returns it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    col = make(pa, table.column(column).to_pylist())
    pq.write_table(table.set_column(table.schema.get_field_index(column), column, col), path)


def _value(column: Callable[[List[str]], str], value: Any, must_stop: Callable[[bool], bool]) -> Damage:
    """One value of a column (chosen among the file's columns) replaced at a random row of a random file."""
    def damage(rng: random.Random, folder: Path, hash_ids: bool) -> bool:
        import pyarrow.parquet as pq

        path = rng.choice(_files(folder))
        name = column(pq.read_schema(path).names)

        def make(pa: Any, values: List[Any]) -> Any:
            row = rng.randrange(len(values))
            new = value(rng) if callable(value) else value
            if isinstance(values[row], list):
                values[row] = [new] + values[row][1:] if values[row] else [new]
            else:
                values[row] = new
            return pa.array(values, type=pq.read_schema(path).field(name).type)
        _set(path, name, make)
        return must_stop(hash_ids)
    return damage


def _label(names: List[str]) -> str:
    return "label"


def _dense(names: List[str]) -> str:
    return random.choice([n for n in names if n.startswith("dense_")])


def _sparse(names: List[str]) -> str:
    return random.choice([n for n in names if n not in ("label",) and not n.startswith("dense_")])


def _retyped(column: Callable[[List[str]], str], to: str) -> Damage:
    """A whole column of one file written as another type (text, floats)."""
    def damage(rng: random.Random, folder: Path, hash_ids: bool) -> bool:
        import pyarrow.parquet as pq

        path = rng.choice(_files(folder))
        name = column(pq.read_schema(path).names)

        def make(pa: Any, values: List[Any]) -> Any:
            flat = [v[0] if isinstance(v, list) and v else (0 if isinstance(v, list) else v) for v in values]
            return pa.array([str(v) for v in flat] if to == "string" else [float(v) + 0.5 for v in flat],
                            type=getattr(pa, to)())
        _set(path, name, make)
        return True
    return damage


def _reshaped(to: str) -> Damage:
    """One file's ids as one id per row (lists elsewhere), or as int32 (int64 elsewhere): must train."""
    def damage(rng: random.Random, folder: Path, hash_ids: bool) -> bool:
        import pyarrow.parquet as pq

        path = rng.choice(_files(folder))
        for name in [n for n in pq.read_schema(path).names if n != "label" and not n.startswith("dense_")]:
            def make(pa: Any, values: List[Any]) -> Any:
                if to == "scalar":
                    return pa.array([v[0] if v else 0 for v in values], type=pa.int64())
                return pa.array(values, type=pa.list_(pa.int32()))
            _set(path, name, make)
        return False
    return damage


def _missing_column(rng: random.Random, folder: Path, hash_ids: bool) -> bool:
    import pyarrow.parquet as pq

    path = rng.choice(_files(folder)[1:])
    table = pq.read_table(path)
    pq.write_table(table.drop_columns([rng.choice([n for n in table.column_names if n != "label"])]), path)
    return True


def _empty_file(rng: random.Random, folder: Path, hash_ids: bool) -> bool:
    import pyarrow.parquet as pq

    table = pq.read_table(_files(folder)[0])
    pq.write_table(table.slice(0, 0), folder / "part-99999.parquet")
    return False


def _not_parquet(rng: random.Random, folder: Path, hash_ids: bool) -> bool:
    (folder / "part-88888.parquet").write_bytes(rng.choice([b"", b"PAR1 not really", bytes(range(256)) * 3]))
    return True


def _row_groups(rng: random.Random, folder: Path, hash_ids: bool) -> bool:
    import pyarrow.parquet as pq

    path = rng.choice(_files(folder))
    table = pq.read_table(path)
    pq.write_table(table, path, row_group_size=rng.choice([1, 3, 7, table.num_rows]))
    return False


DAMAGES: Dict[str, Damage] = {
    "label 2": _value(_label, 2, lambda h: True),
    "label -1": _value(_label, -1, lambda h: True),
    "label null": _value(_label, None, lambda h: True),
    "dense NaN": _value(_dense, float("nan"), lambda h: True),
    "dense inf": _value(_dense, float("-inf"), lambda h: True),
    "dense null": _value(_dense, None, lambda h: True),
    "dense as text": _retyped(_dense, "string"),
    "id negative": _value(_sparse, -5, lambda h: not h),
    "id past its table": _value(_sparse, lambda rng: rng.choice([10**7, 2**40]), lambda h: not h),
    "id null": _value(_sparse, None, lambda h: True),
    "ids as floats": _retyped(_sparse, "float64"),
    "ids as text": _retyped(_sparse, "string"),
    "ids one per row in one file": _reshaped("scalar"),
    "ids int32 in one file": _reshaped("int32"),
    "a column missing in one file": _missing_column,
    "an empty file": _empty_file,
    "a file that is not Parquet": _not_parquet,
    "row groups of a few rows or all": _row_groups,
}


def clean_folder(out: Path) -> Path:
    """The clean data every drawn folder starts from."""
    folder = out / "clean"
    if not (folder / "train").exists():
        subprocess.run([str(PY), "-m", "runner", "mode=write_data", "data=parquet", f"data.path={folder}",
                        f"data.write_rows={ROWS}", f"tracking.uri=sqlite:///{out / 'write.db'}",
                        f"hydra.run.dir={out / 'write'}"], cwd=ROOT, check=True, capture_output=True)
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=100, help="damaged folders")
    ap.add_argument("--seed", type=int, default=None, help="default: drawn, and printed for a replay")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a job may take")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "fuzz-data")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    rng = random.Random(seed)
    random.seed(seed)  # the column choices of the damages
    out = args.out.resolve() / str(seed)
    out.mkdir(parents=True, exist_ok=True)
    clean = clean_folder(args.out.resolve())
    print(f"[fuzz-data] seed {seed}: {args.count} folders, {len(DAMAGES)} kinds of damage; folders under {out}",
          flush=True)
    counts: Dict[str, int] = {}
    findings: List[Dict[str, Any]] = []
    start = time.monotonic()
    for i in range(args.count):
        folder = out / f"{i:04d}"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(clean, folder / "data")
        hash_ids = rng.random() < 0.5
        drawn = rng.sample(sorted(DAMAGES), rng.randint(1, 3))
        must_stop = False
        for name in drawn:
            must_stop |= DAMAGES[name](rng, folder / "data" / "train", hash_ids)
        cmd = ["data=parquet", f"data.path={folder / 'data' / 'train'}", f"data.eval_path={folder / 'data' / 'eval'}",
               f"data.hash_ids={str(hash_ids).lower()}", f"train.steps={args.steps}", "train.log_every=1",
               "data.eval_batches=2", "train.checkpoint.enabled=false", "tracking.system_metrics=false"]
        kind, line = run_one(cmd, folder, args.timeout)
        if kind == "done" and must_stop:
            kind = "finding: done on data that must stop it"
        counts[kind] = counts.get(kind, 0) + 1
        print(f"[fuzz-data] {i:04d} ({', '.join(drawn)}; data.hash_ids={str(hash_ids).lower()}): {kind}: "
              f"{line[:240]}", flush=True)
        if kind.startswith("finding"):
            findings.append({"kind": kind, "line": line, "damages": drawn, "hash_ids": hash_ids,
                             "folder": str(folder), "args": cmd})
            print(f"[fuzz-data] FINDING {kind} ({', '.join(drawn)}; data.hash_ids={hash_ids}): {line}\n  replay: "
                  f"python -m runner {' '.join(cmd)}", flush=True)
        if (i + 1) % 5 == 0 or i + 1 == args.count:
            print(f"[fuzz-data] {i + 1}/{args.count} folders, {time.monotonic() - start:.0f} s: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
    return finish("fuzz-data", out, seed, counts, findings, f"{args.count} folders, {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
