"""The supported stacks (``requirements/stacks.toml``) and a CPU environment for each, for ``make compat``.

An environment is a venv under ``.compat/<stack>/``: the stack's torch from the registry (the CPU build where the
machine's wheel cache has one, else PyPI's Linux build, which imports and runs on a CPU), FBGEMM's CPU build of
the stack's version, the runner with what it declares (``requirements/lock.txt`` as constraints), then TorchRec
with ``--no-deps`` (it declares the CUDA FBGEMM), as ``make run`` builds the pinned one. A finished environment is
marked (``.built`` holding the stack's versions) and reused while the stack is unchanged.
"""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
STACKS_FILE = ROOT / "requirements" / "stacks.toml"
ENVS = ROOT / ".compat"


@dataclass(frozen=True)
class Stack:
    name: str
    torchrec: str
    fbgemm: str
    torch: str

    def versions(self) -> str:
        return f"torchrec {self.torchrec}, fbgemm {self.fbgemm}, torch {self.torch}"


def load_stacks(path: Path = STACKS_FILE) -> Dict[str, Stack]:
    """Every stack the file lists, by name, in the file's order."""
    data = tomllib.loads(path.read_text())
    return {name: Stack(name, str(s["torchrec"]), str(s["fbgemm"]), str(s["torch"]))
            for name, s in data["stacks"].items()}


def pinned_stack(path: Path = STACKS_FILE) -> Stack:
    data = tomllib.loads(path.read_text())
    return load_stacks(path)[data["pinned"]]


def env_python(stack: Stack) -> Path:
    return ENVS / stack.name / "bin" / "python"


def _run(cmd: List[str], log: Path) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        done = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text().strip().splitlines()[-3:]
        raise RuntimeError(f"`{' '.join(cmd[2:6])} ...` failed (exit {done.returncode}; {log}): "
                           + " | ".join(tail))


def build_env(stack: Stack, quiet: bool = False) -> Path:
    """The stack's venv, built (about a minute a stack with a warm pip cache; several GB of CUDA libraries are
    downloaded once for a torch that has no CPU build here) or reused. Returns its python."""
    marker = ENVS / stack.name / ".built"
    python = env_python(stack)
    if marker.exists() and marker.read_text() == stack.versions() and python.exists():
        return python
    ENVS.mkdir(exist_ok=True)
    log = ENVS / f"{stack.name}.install.log"
    log.write_text("")
    start = time.monotonic()
    if not quiet:
        print(f"[compat] building {stack.name} ({stack.versions()}) in {ENVS / stack.name} (log: {log})",
              flush=True)
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(ENVS / stack.name)], log)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run(pip + [f"torch=={stack.torch}", f"fbgemm-gpu-cpu=={stack.fbgemm}"], log)
    _run(pip + ["-e", ".", "pytest==9.2.0", "-c", "requirements/lock.txt"], log)
    _run(pip + ["--no-deps", f"torchrec=={stack.torchrec}"], log)
    marker.write_text(stack.versions())
    if not quiet:
        print(f"[compat] {stack.name} ready in {time.monotonic() - start:.0f} s", flush=True)
    return python


if __name__ == "__main__":
    names = sys.argv[1:] or list(load_stacks())
    for n in names:
        build_env(load_stacks()[n])
