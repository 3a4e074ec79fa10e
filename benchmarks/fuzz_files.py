"""``make fuzz-files``: every file the runner writes and reads back, damaged at random, each read by the command
that reads it, and the outcomes sorted. Not part of ``make test``.

    make fuzz-files ARGS="--count 300 --seed 7"
    python3 benchmarks/fuzz_files.py [--count N] [--seed S] [--case I] [--only KIND] [--out outputs/fuzz-files]

The files (:mod:`fuzz_files_kinds`, each made clean once by the runner's own writers): a calibration YAML given by
path and found by ``auto``, an Optuna sweep's journal, a run folder's ``events.jsonl``, ``events_writer.json``,
``delivered.json``, ``run.json`` and ``status.json`` (``runner sync``), a sweep point's ``status.json``,
``results.json`` and ``run.json`` (``runner resume`` keeping it), ``sweep.json`` (``runner resume``), a pinned
``plan.json`` (``sharding.plan``) and a checkpoint's ``meta.json`` (``train.resume``). Each case damages one file
one way (:data:`DAMAGES`): cut short, a value turned NaN, negative, huge or of another type, a key missing or added,
another format version, two writers interleaved; a calibration's value and key damages are drawn both as an edit
(its digest then no longer matches) and written again with a new digest (through its value checks).

The reader runs in a forked child with a time limit (a case takes well under a second). Its outcome is one of

- ``refused``: one line naming the file (an exception of the reader's kind, or one ``error:`` line and a
  non-zero exit);
- ``same``: read to the same values as the undamaged file;
- ``passed over``: a line names the file and what was passed over, and what was read is the clean reading less
  it (a torn event line, a point run again, a calibration part fallen back);
- ``read as written``: the damage left a value the file's own writer could have written (a metric of another
  value or another name, a trial's objective), so the file is another valid one;

and anything else is a **finding**: a traceback, an ``unexpected error``, a hang, a refusal that is not one line
naming the file, values the undamaged file did not hold, or a file the reader rewrote that then reads to a
finding. Each case is replayed alone with ``--seed S --case I``; findings are written to
``<out>/<seed>/findings.json`` (exit 1 when there is any).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import random
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from fuzz_config import finish  # noqa: E402
from fuzz_files_kinds import MISSING, Kind, Path_, kinds, relocate  # noqa: E402

Doc = Any
Damage = Callable[[random.Random, Kind, str, str, bytes], Tuple[bytes, str, bool]]


def parse(fmt: str, data: bytes) -> Doc:
    import yaml

    if fmt == "jsonl":
        return [json.loads(line) for line in data.splitlines()]
    return yaml.safe_load(data) if fmt == "yaml" else json.loads(data)


def dump(fmt: str, doc: Doc, data: bytes, changed: Optional[int] = None) -> bytes:
    """``doc`` written as its writer writes it; a JSON-lines file keeps every line's bytes but the ``changed`` one."""
    import yaml

    if fmt == "jsonl":
        lines = data.splitlines(keepends=True)
        lines[changed or 0] = (json.dumps(doc[changed or 0]) + "\n").encode()
        return b"".join(lines)
    if fmt == "yaml":
        return yaml.safe_dump(doc, sort_keys=False).encode()
    return json.dumps(doc, indent=2).encode()


def leaves(doc: Doc, path: Path_ = ()) -> List[Tuple[Path_, Any]]:
    """Every value that is not a container, with its path."""
    if isinstance(doc, dict):
        return [x for k, v in doc.items() for x in leaves(v, (*path, k))]
    if isinstance(doc, list) and doc:
        return [x for i, v in enumerate(doc) for x in leaves(v, (*path, i))]
    return [(path, doc)]


def dicts(doc: Doc, path: Path_ = ()) -> List[Path_]:
    """The path of every mapping (a key can go missing or be added there)."""
    found = [path] if isinstance(doc, dict) else []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    return found + [p for k, v in items for p in dicts(v, (*path, k))]


def at(doc: Doc, path: Path_) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def _edit(change: Callable[[random.Random, Any], Any], numeric: bool) -> Damage:
    """One value (a number's where ``numeric``) set to what ``change`` makes of it."""
    def damage(rng: random.Random, kind: Kind, file: str, fmt: str, data: bytes) -> Tuple[bytes, str, bool]:
        doc = parse(fmt, data)
        found = [(p, v) for p, v in leaves(doc) if p and (not numeric or _number(v))] or \
            [(p, v) for p, v in leaves(doc) if p]
        path, old = rng.choice(found)
        new = change(rng, old)
        at(doc, path[:-1])[path[-1]] = new
        return _written(rng, kind, fmt, doc, data, path), f"{_name(path)}: {old!r} -> {new!r}", \
            kind.domain(file, path, new)
    return damage


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _name(path: Path_) -> str:
    return ".".join(map(str, path))


def _written(rng: random.Random, kind: Kind, fmt: str, doc: Doc, data: bytes, path: Path_) -> bytes:
    """The damaged document as bytes; for a file with a digest, half the time written again with a new digest (as
    ``save`` writes it), so that its value checks are what refuses it."""
    if kind.digest and isinstance(doc, dict) and rng.random() < 0.5:
        from runner.plan.cost.calibration import digest

        doc["digest"] = digest(doc)
        kind.resaved = True  # type: ignore[attr-defined]
    return dump(fmt, doc, data, path[0] if fmt == "jsonl" and path else None)


def _negative(rng: random.Random, v: Any) -> Any:
    return -v if _number(v) and v else (-1 if isinstance(v, int) else -1.0)


def _huge(rng: random.Random, v: Any) -> Any:
    return rng.choice([10**30, 2**63]) if isinstance(v, int) else rng.choice([1e300, float("inf")])


def _retyped(rng: random.Random, v: Any) -> Any:
    if isinstance(v, str):
        return rng.choice([12, None, ["x"]])
    if isinstance(v, (dict, list)):
        return "text"
    return rng.choice(["text", str(v), [v], {"v": v}, True])


def _truncated(rng: random.Random, kind: Kind, file: str, fmt: str, data: bytes) -> Tuple[bytes, str, bool]:
    cut = rng.randrange(len(data))
    # a run's event log is appended line by line: cut anywhere, it is the log as its writer left it at some moment
    # (the lines after not written yet, the torn last one still being written)
    return data[:cut], f"cut at byte {cut} of {len(data)}", file.endswith("events.jsonl")


def _key_missing(rng: random.Random, kind: Kind, file: str, fmt: str, data: bytes) -> Tuple[bytes, str, bool]:
    doc = parse(fmt, data)
    path = rng.choice([p for p in dicts(doc) if at(doc, p)])
    key = rng.choice(list(at(doc, path)))
    del at(doc, path)[key]
    return _written(rng, kind, fmt, doc, data, path), f"{_name((*path, key))} removed", \
        kind.domain(file, (*path, key), MISSING)


def _key_added(rng: random.Random, kind: Kind, file: str, fmt: str, data: bytes) -> Tuple[bytes, str, bool]:
    doc = parse(fmt, data)
    path = rng.choice(dicts(doc))
    at(doc, path)["fuzz_extra"] = rng.choice([1, -1.5, "x", None, [1, 2]])
    # a key the reader does not know is ignored: the reading must be the clean one (the key is never in a reading);
    # in a metrics event a number under a new name is a metric the job could have logged
    plausible = bool(path) and path[-1] == "metrics" and _number(at(doc, path)["fuzz_extra"])
    return _written(rng, kind, fmt, doc, data, path), f"{_name((*path, 'fuzz_extra'))} added", plausible


def _other_format(rng: random.Random, kind: Kind, file: str, fmt: str, data: bytes) -> Tuple[bytes, str, bool]:
    doc = parse(fmt, data)
    if isinstance(doc, dict) and "format" in doc:
        doc["format"] = rng.choice([1, 3, "2", 2.5])
        return _written(rng, kind, fmt, doc, data, ()), f"format -> {doc['format']!r}", False
    if fmt == "jsonl":  # the journal of an older runner: Optuna 2.10's pickled study beside no journal
        return b"", "the journal emptied, an older runner's optuna_study.pkl beside it", False
    return json.dumps({"format": 3, "record": doc}).encode(), "wrapped as a newer format's record", False


def _interleaved(rng: random.Random, kind: Kind, file: str, fmt: str, data: bytes) -> Tuple[bytes, str, bool]:
    """A second writer's version of the file (each number of it changed) mixed with the first's: whole lines of a
    line format (as two appending writers leave them; a line torn by the other writer now and then), or one write
    cut by the other's of a whole document."""
    doc = parse(fmt, data)
    for path, v in leaves(doc):
        if _number(v) and path:
            at(doc, path[:-1])[path[-1]] = v + 1
    if fmt == "jsonl":
        mine, theirs = data.splitlines(keepends=True), [(json.dumps(x) + "\n").encode() for x in doc]
        mixed: List[bytes] = []
        while mine or theirs:
            src = mine if mine and (not theirs or rng.random() < 0.5) else theirs
            mixed.append(src.pop(0))
        torn = rng.random() < 0.4
        if torn:
            i = rng.randrange(len(mixed))
            mixed[i] = mixed[i][: max(1, len(mixed[i]) // 2)]
        return b"".join(mixed), "two writers' lines interleaved" + (", one torn" if torn else ""), False
    other = dump(fmt, doc, data)
    cut = rng.randrange(1, len(data))
    return (data[:cut] + other if rng.random() < 0.5 else data + other), f"a second write after byte {cut}", False


DAMAGES: Dict[str, Damage] = {
    "truncated": _truncated,
    "NaN": _edit(lambda rng, v: float("nan"), True),
    "negative": _edit(_negative, True),
    "huge": _edit(_huge, True),
    "another type": _edit(_retyped, False),
    "key missing": _key_missing,
    "key added": _key_added,
    "another format version": _other_format,
    "two writers interleaved": _interleaved,
}


def _child(kind: Kind, case: Path) -> None:
    """The reader in this forked process, its output in ``output.txt`` and its answer in ``result.json``."""
    fd = os.open(case / "output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.chdir(case)
    result: Dict[str, Any]
    try:
        result = {"reading": kind.read(case)}
    except SystemExit as exc:
        result = {"exit": exc.code}
    except kind.refusals as exc:
        result = {"refused": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - anything else is the finding
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    sys.stdout.flush()
    sys.stderr.flush()
    # the case's own folder named as such, so that readings of two copies compare
    (case / "result.json").write_text(json.dumps(result, default=repr, sort_keys=True).replace(str(case), "<case>"))
    os._exit(0)  # no library's exit handlers: the parent's state is theirs


def read_case(kind: Kind, case: Path, timeout: float) -> Tuple[Optional[Dict[str, Any]], str]:
    """The reader's answer (None: it ran past ``timeout``) and what it printed."""
    (case / "result.json").unlink(missing_ok=True)
    proc = multiprocessing.get_context("fork").Process(target=_child, args=(kind, case))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
    out = (case / "output.txt").read_text(errors="replace") if (case / "output.txt").exists() else ""
    found = case / "result.json"
    return (json.loads(found.read_text()) if found.exists() else None), out


def _same(a: Any, b: Any) -> bool:
    def norm(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: norm(v) for k, v in x.items() if k != "fuzz_extra"}
        if isinstance(x, list):
            return [norm(v) for v in x]
        return repr(x) if isinstance(x, float) and math.isnan(x) else x
    return json.dumps(norm(a), sort_keys=True, default=repr) == json.dumps(norm(b), sort_keys=True, default=repr)


def judge(kind: Kind, file: str, result: Optional[Dict[str, Any]], out: str, clean: Any,
          plausible: bool) -> Tuple[str, str]:
    """The case's outcome (see the module doc) and the line that says it."""
    names = [Path(file).name] + (["optuna_study.pkl"] if file.endswith("optuna_journal.log") else [])
    lines = [ln for ln in out.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    if result is None:
        return "finding: hang", f"no answer within the time limit; {lines[-1:] or ''}"
    if "Traceback" in out or "unexpected error" in out:
        return "finding: traceback", next((ln for ln in reversed(lines) if "Error" in ln), lines[-1])[:300]
    if "error" in result:
        return "finding: traceback", result["error"][:300]
    if "refused" in result:
        said = result["refused"]
        ok = "\n" not in said.strip() and any(n in said for n in names)
        return ("refused" if ok else "finding: refusal not one line naming the file"), said[:300]
    reading = result.get("reading")
    failed = "exit" in result and result["exit"] not in (0, None) or isinstance(reading, dict) and reading.get("rc")
    if failed:
        ok = len(errors) == 1 and any(n in errors[0] for n in names)
        return ("refused" if ok else "finding: not one error line naming the file"), \
            (errors[0] if errors else (lines or [""])[-1])[:300]
    if "exit" in result:
        return "finding: exited 0 without an answer", (lines or [""])[-1][:300]
    if _same(reading, clean):
        return "same", ""
    said = [ln for ln in lines if any(n in ln for n in names)
            and any(w in ln for w in ("warning", "skipped", "not used"))]
    if said and kind.subset(reading, clean):
        return "passed over", said[0][:300]
    if plausible:
        return "read as written", ""
    return "finding: values the undamaged file did not hold", json.dumps(reading, default=repr)[:300]


def run_case(kind: Kind, file: str, fmt: str, damage: str, rng: random.Random, clean_dir: Path, case: Path,
             clean: Any, timeout: float) -> Tuple[str, str, str]:
    """One damaged copy read back: (outcome, its line, what was damaged)."""
    shutil.rmtree(case, ignore_errors=True)
    relocate(clean_dir, case)
    target = case / file
    kind.resaved = False  # type: ignore[attr-defined]
    data, desc, plausible = DAMAGES[damage](rng, kind, file, fmt, target.read_bytes())
    if kind.digest and not getattr(kind, "resaved", False):
        plausible = False  # an edit its digest no longer matches: refused whatever the value
    elif kind.digest:
        desc += ", written again with its digest"
    target.write_bytes(data)
    if damage == "another format version" and fmt == "jsonl":
        (target.parent / "optuna_study.pkl").write_bytes(b"\x80\x04\x95pickled study of Optuna 2.10")
        target.unlink()
    result, out = read_case(kind, case, timeout)
    kind_, line = judge(kind, file, result, out, clean, plausible)
    if not kind_.startswith("finding") and target.exists() and target.read_bytes() != data:
        again, out2 = read_case(kind, case, timeout)  # the reader rewrote it: read it once more
        second, line2 = judge(kind, file, again, out2, clean, True)
        if second.startswith("finding"):
            return "finding: the file was damaged further", f"second read: {second}: {line2}", desc
    return kind_, line, desc


def prepare(out: Path, chosen: List[Kind], timeout: float) -> Dict[str, Any]:
    """Each kind's clean folder (made once) and its clean reading (which must read without a word)."""
    readings = {}
    for kind in chosen:
        folder = out / "clean" / kind.name
        if not (folder / ".made").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            kind.make(folder)
            (folder / ".made").write_text("")
        probe = out / "clean-probe" / kind.name
        shutil.rmtree(probe, ignore_errors=True)
        relocate(folder, probe)
        result, said = read_case(kind, probe, timeout)
        if result is None or "reading" not in result:
            raise SystemExit(f"[fuzz-files] the clean {kind.name} does not read: {result} {said[-2000:]}")
        readings[kind.name] = result["reading"]
    return readings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=300, help="damaged files")
    ap.add_argument("--seed", type=int, default=None, help="default: drawn, and printed for a replay")
    ap.add_argument("--case", type=int, default=None, help="replay this case of the seed alone")
    ap.add_argument("--only", default=None, help="one kind of file (its name as printed)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds one read may take")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "fuzz-files")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    start = time.monotonic()
    import mlflow  # noqa: F401  (imported once, before the forks: each case then starts in milliseconds)
    import optuna  # noqa: F401
    import torchrec.distributed.planner  # noqa: F401

    every = [k for k in kinds() if args.only in (None, k.name)]
    base = args.out.resolve()
    out = base / str(seed)
    clean = prepare(base, every, args.timeout)
    print(f"[fuzz-files] seed {seed}: {args.count} cases over {len(every)} kinds of file "
          f"({', '.join(k.name for k in every)}), {len(DAMAGES)} damages; ready in {time.monotonic() - start:.0f} s; "
          f"cases under {out}", flush=True)
    counts: Dict[str, int] = {}
    findings: List[Dict[str, Any]] = []
    cases = [args.case] if args.case is not None else range(args.count)
    for i in cases:
        rng = random.Random(f"{seed}-{i}")  # each case replays alone (--case)
        kind = every[i % len(every)]
        file, fmt = rng.choice(sorted(kind.files.items()))
        damage = rng.choice(sorted(DAMAGES))
        case = out / f"{i:04d}"
        outcome, line, desc = run_case(kind, file, fmt, damage, rng, base / "clean" / kind.name, case,
                                       clean[kind.name], args.timeout)
        counts[outcome] = counts.get(outcome, 0) + 1
        print(f"[fuzz-files] {i:04d} {kind.name} {file} {damage} ({desc[:160]}): {outcome}"
              + (f": {line[:200]}" if line else ""), flush=True)
        if outcome.startswith("finding"):
            findings.append({"case": i, "kind": kind.name, "file": file, "damage": damage, "what": desc,
                             "outcome": outcome, "line": line, "folder": str(case)})
            print(f"[fuzz-files] FINDING {outcome}: {line}\n  replay: python3 benchmarks/fuzz_files.py --seed {seed} "
                  f"--case {i}", flush=True)
        else:
            shutil.rmtree(case, ignore_errors=True)
        if args.case is None and ((i + 1) % 25 == 0 or i + 1 == args.count):
            print(f"[fuzz-files] {i + 1}/{args.count} cases, {time.monotonic() - start:.0f} s: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
    return finish("fuzz-files", out, seed, counts, findings, f"{len(cases)} cases, {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
