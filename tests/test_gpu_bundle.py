"""The GPU bundle (``benchmarks/gpu_bundle.py``): parts within their size, a manifest with checksums, a damaged or
missing part named, and an install from the parts into an empty folder with pip's network off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_bundle  # noqa: E402


def _wheel(folder: Path, name: str, payload: bytes) -> Path:
    """A pure-Python wheel of one package holding ``payload`` as data."""
    path = folder / f"{name}-0.1-py3-none-any.whl"
    info = f"{name}-0.1.dist-info"
    files = {f"{name}/__init__.py": "DATA = __import__('pathlib').Path(__file__).with_name('data.bin')\n".encode(),
             f"{name}/data.bin": payload,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = ("".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n").encode()
    with zipfile.ZipFile(path, "w") as z:
        for arc, data in files.items():
            z.writestr(arc, data)
    return path


def test_a_bundle_in_parts_installs_offline_into_an_empty_folder(tmp_path: Path) -> None:
    folder, out, target = tmp_path / "bundle", tmp_path / "parts", tmp_path / "site"
    (folder / "wheels").mkdir(parents=True)
    for name in ("probe_one", "probe_two"):
        _wheel(folder / "wheels", name, os.urandom(150 * 1024))  # incompressible: several parts
    unpacked = folder / "unpacked" / "fake_fbgemm"  # FBGEMM goes unpacked (its libraries compress)
    unpacked.mkdir(parents=True)
    (unpacked / "__init__.py").write_text("LIB = b'" + "ab" * 50_000 + "'\n")
    part = 64 * 1024
    manifest = gpu_bundle.pack(folder, out, part, {"stack": "test"}, say=lambda _: None)
    parts = manifest["parts"]
    assert len(parts) >= 5 and all(p["bytes"] <= part for p in parts)
    assert sorted(p.name for p in out.iterdir()) == sorted([gpu_bundle.MANIFEST, *(p["name"] for p in parts)])
    assert json.loads((out / gpu_bundle.MANIFEST).read_text())["files"] == [
        "unpacked/fake_fbgemm/__init__.py", "wheels/probe_one-0.1-py3-none-any.whl",
        "wheels/probe_two-0.1-py3-none-any.whl"]

    second = out / parts[1]["name"]
    good = second.read_bytes()
    second.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(SystemExit, match=f"bundle part {second} is damaged"):
        gpu_bundle.install(out, target, None)
    second.unlink()
    with pytest.raises(SystemExit, match=f"bundle part {second} is missing"):
        gpu_bundle.install(out, target, None)
    second.write_bytes(good)

    line = gpu_bundle.install(out, target, None)
    assert "2 wheels and FBGEMM" in line and "no network" in line
    probe = subprocess.run([sys.executable, "-c", "import probe_one, probe_two, fake_fbgemm; "
                            "print(probe_one.DATA.stat().st_size, len(fake_fbgemm.LIB))"],
                           env={**os.environ, "PYTHONPATH": str(target)}, cwd=tmp_path, capture_output=True, text=True)
    assert probe.stdout.split() == [str(150 * 1024), "100000"], probe.stderr

    # into a venv made by a Python that is itself a venv's (as a GPU image's python3 is: this suite's .venv here),
    # seeing that venv's packages (torch) after the bundle's, with no pip of its own
    venv = tmp_path / "venv"
    line = gpu_bundle.install(out, None, venv, python=sys.executable)
    assert "2 wheels and FBGEMM" in line and (venv / ".cuda").exists() and not (venv / "bin" / "pip").exists()
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import probe_one, fake_fbgemm, torch, runner; "
                            "print(probe_one.__file__.startswith(%r), torch.__version__)" % str(venv)],
                           cwd=tmp_path, capture_output=True, text=True)
    assert probe.stdout.split() == ["True", __import__("torch").__version__], probe.stderr


def test_the_bundle_takes_what_a_job_needs_and_not_the_images_torch() -> None:
    pins = {p.split("==")[0].lower() for p in gpu_bundle.runtime_pins()}
    assert {"hydra-core", "mlflow", "omegaconf", "tensordict", "torchmetrics", "pytest", "numpy"} <= pins
    assert not pins & {"torch", "sympy", "networkx", "ruff", "mypy", "moto"}
