"""The install: the Makefile's pinned stack is requirements/stacks.toml's, the runner's planner names that
TorchRec as the one it was tested with, and the environment line says which build of torch came."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_makefile_installs_the_pinned_stack() -> None:
    from runner.plan.torchrec_adapter.torchrec_seam import TESTED_WITH

    stacks = tomllib.loads((ROOT / "requirements" / "stacks.toml").read_text())
    pinned = stacks["stacks"][stacks["pinned"]]
    make = dict(re.findall(r"^(TORCH_VERSION|FBGEMM_VERSION|TORCHREC_VERSION) := (\S+)$",
                           (ROOT / "Makefile").read_text(), re.M))
    assert make == {"TORCH_VERSION": pinned["torch"], "FBGEMM_VERSION": pinned["fbgemm"],
                    "TORCHREC_VERSION": pinned["torchrec"]}
    assert TESTED_WITH == pinned["torchrec"]
    # the newest supported stack is the one installed
    newest = max(stacks["stacks"].values(), key=lambda s: tuple(int(p) for p in s["torchrec"].split(".")))
    assert newest == pinned


def test_the_environment_line_says_which_build_came() -> None:
    from runner.runtime.hardware import build_note, install_line

    assert build_note(None, 0, 0.0) == "CPU build"
    assert build_note("13.0", 8, 3200.0) == "CUDA 13.0 build, 8 GPU(s)"
    note = build_note("13.0", 0, 3200.0)
    assert note.startswith("CUDA 13.0 build on a CPU-only machine: 3.1 GiB of NVIDIA libraries it does not use")
    assert "TORCH_CPU_INDEX" in note
    import torch

    line = install_line()
    assert line.startswith(f"environment ready: torch {torch.__version__} | ")
    assert line.endswith("CPU build") == (torch.version.cuda is None)
