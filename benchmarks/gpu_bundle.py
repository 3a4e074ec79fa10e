"""``make gpu-bundle``: everything a GPU image with torch lacks, as parts small enough to carry to a box with no
network; and the one command that installs from them there.

On a machine with the package registry (this one)::

    make gpu-bundle TORCH=2.11.0 PYTHON=3.12 [PART_MIB=58] [OUT=outputs/gpu-bundle]

picks the supported stack whose torch is the image's (``requirements/stacks.toml``: torch 2.11 -> TorchRec 1.6.1
and FBGEMM 1.6.0), then downloads for that Python on manylinux x86_64: FBGEMM's CUDA build for that torch, TorchRec,
and the runner's dependencies (their versions from ``requirements/lock.txt``; the image's torch and what torch
needs are not taken). FBGEMM's wheel (465 MB at 1.6.0) is unpacked so that its libraries compress with xz (to
about a quarter); the rest stay wheels. Everything goes into one ``bundle.tar.xz``, cut into parts of at most
PART_MIB MiB (``bundle.tar.xz.part000``, ...), with ``manifest.json`` (the stack, the Python, every file in the
archive, each part's size and SHA-256) beside them.

On the GPU box, with the parts and this project's tree copied there, no network::

    python3 benchmarks/gpu_bundle.py install --parts DIR             # .venv seeing the image's torch, then
    make gpu-check                                                   # ... runs there unchanged
    python3 benchmarks/gpu_bundle.py install --parts DIR --target T  # or into a folder (PYTHONPATH=T)

checks every part's size and checksum against the manifest (a missing or damaged part is named), joins and
unpacks them, installs the wheels with ``pip --no-index --no-deps`` and puts FBGEMM's files in place. With
``--venv`` (the default, ``.venv``) the venv sees the image's packages (its torch, also where the image's python3
is itself a venv), the runner is put on its path, and it is marked as ``make gpu-env`` marks a CUDA venv, so
``make gpu-check`` uses it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Dict, Iterable, List, Optional

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
ARCHIVE = "bundle.tar.xz"
MANIFEST = "manifest.json"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")
# the image's torch brings these (and torch's CUDA libraries); the lint tools and the S3 test server are not needed
# there (pytest is: make gpu-check runs the GPU tests)
NOT_TAKEN = {"torch", "triton", "filelock", "typing-extensions", "sympy", "mpmath", "networkx", "jinja2",
             "markupsafe", "setuptools", "ruff", "mypy",
             "mypy-extensions", "librt", "ast-serialize", "pathspec", "moto", "responses", "cfn-lint", "aws-xray-sdk",
             "py-partiql-parser", "openapi-schema-validator", "openapi-spec-validator", "jsonschema-path",
             "pathable", "lazy-object-proxy", "rfc3339-validator", "joserfc", "jsonpath-ng", "xmltodict",
             "jsonpatch", "jsonpointer", "regex", "wrapt", "boto3", "botocore", "s3transfer", "jmespath"}


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(4 * MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def runtime_pins(lock: Path = ROOT / "requirements" / "lock.txt") -> List[str]:
    """``name==version`` of every locked package a job needs at run time, less what the image's torch brings."""
    pins = []
    for line in lock.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line and _norm(line.split("==")[0]) not in NOT_TAKEN and not line.startswith("nvidia-"):
            pins.append(line)
    return pins


def pack(folder: Path, out: Path, part_bytes: int, meta: Dict[str, object], say=print) -> Dict[str, object]:
    """``folder``'s files as ``out/bundle.tar.xz`` cut into parts of at most ``part_bytes``, and the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{ARCHIVE}.part*"):
        old.unlink()
    archive = out / ARCHIVE
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    names = [str(p.relative_to(folder)) for p in files]
    start = time.monotonic()
    if shutil.which("tar") and shutil.which("xz"):  # xz on every core: several times Python's one-thread lzma
        with archive.open("wb") as dst:
            tar = subprocess.Popen(["tar", "-C", str(folder), "-cf", "-", "--", *names], stdout=subprocess.PIPE)
            xz = subprocess.Popen(["xz", "-6", "-T0", "-c"], stdin=tar.stdout, stdout=dst)
            assert tar.stdout is not None
            tar.stdout.close()
            while xz.poll() is None:
                time.sleep(0.5)
                if time.monotonic() - start > 10 and int(time.monotonic() - start) % 10 == 0:
                    say(f"[gpu-bundle] compressing: {archive.stat().st_size / MIB:.0f} MiB written, "
                        f"{time.monotonic() - start:.0f} s")
                    time.sleep(0.5)
            if tar.wait() != 0 or xz.returncode != 0:
                raise SystemExit(f"error: packing the bundle failed (tar exit {tar.returncode}, xz {xz.returncode})")
    else:
        last = start
        with lzma.open(archive, "wb", preset=6) as xzf, tarfile.open(fileobj=xzf, mode="w") as tarf:
            for i, path in enumerate(files):
                tarf.add(path, arcname=names[i], recursive=False)
                if time.monotonic() - last > 10:
                    say(f"[gpu-bundle] compressing: {i + 1} of {len(files)} files, {time.monotonic() - start:.0f} s")
                    last = time.monotonic()
    parts = []
    with archive.open("rb") as src:
        for index in range(10**4):
            block = src.read(part_bytes)
            if not block:
                break
            part = out / f"{ARCHIVE}.part{index:03d}"
            part.write_bytes(block)
            parts.append({"name": part.name, "bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()})
    archive.unlink()
    manifest = {**meta, "archive": ARCHIVE, "parts": parts,
                "files": names,
                "archive_bytes": sum(int(p["bytes"]) for p in parts)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def verified_parts(parts_dir: Path) -> Dict[str, object]:
    """The manifest, once every part it names is there with its size and checksum; else one line naming the part."""
    manifest_path = parts_dir / MANIFEST
    if not manifest_path.exists():
        raise SystemExit(f"error: {manifest_path} is missing: copy the bundle's manifest.json with its parts")
    manifest = json.loads(manifest_path.read_text())
    for part in manifest["parts"]:
        path = parts_dir / part["name"]
        if not path.exists():
            raise SystemExit(f"error: bundle part {path} is missing ({len(manifest['parts'])} parts expected)")
        if path.stat().st_size != part["bytes"] or _sha256(path) != part["sha256"]:
            raise SystemExit(f"error: bundle part {path} is damaged (size or SHA-256 differs from manifest.json): "
                             "copy it again")
    return manifest


def unpack(parts_dir: Path, into: Path) -> Dict[str, object]:
    """Checks, joins and unpacks the parts into ``into``; returns the manifest."""
    manifest = verified_parts(parts_dir)
    joined = into / ARCHIVE
    with joined.open("wb") as dst:
        for part in manifest["parts"]:
            with (parts_dir / part["name"]).open("rb") as src:
                shutil.copyfileobj(src, dst, 16 * MIB)
    with lzma.open(joined) as xz, tarfile.open(fileobj=xz) as tar:
        tar.extractall(into, filter="data")
    joined.unlink()
    return manifest


def install(parts_dir: Path, target: Optional[Path], venv: Optional[Path], python: str = sys.executable) -> str:
    """Installs the bundle with no network: into ``target`` (a folder for PYTHONPATH) or a venv that sees the
    image's packages. Returns the line to say."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-") as tmp:
        manifest = unpack(parts_dir, Path(tmp))
        if venv is not None:
            dest = _venv_seeing(venv, python)
        else:
            assert target is not None
            dest = target
        dest.mkdir(parents=True, exist_ok=True)
        wheels = sorted(str(p) for p in (Path(tmp) / "wheels").glob("*.whl"))
        if wheels:  # with the image's pip into the folder, a venv's too (it is made without pip)
            subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                            "--disable-pip-version-check", "--target", str(dest), *wheels], check=True,
                           env={**os.environ, "PIP_NO_INDEX": "1", "PIP_CONSTRAINT": "", "PIP_FIND_LINKS": ""})
        unpacked = (Path(tmp) / "unpacked").exists()
        if unpacked:
            shutil.copytree(Path(tmp) / "unpacked", dest, dirs_exist_ok=True)
        if venv is not None:
            (dest / "runner_project.pth").write_text(str(ROOT) + "\n")  # the runner from this tree
            (venv / ".cuda").touch()  # as `make gpu-env` marks a CUDA venv: nothing installs a CPU FBGEMM here
            (venv / ".installed").touch()
    into = f"venv {venv} (with the image's packages)" if venv is not None else f"{target} (PYTHONPATH={target})"
    return (f"[gpu-bundle] installed {manifest.get('stack', 'the bundle')} into {into}: {len(wheels)} wheels"
            f"{' and FBGEMM' if unpacked else ''} in {time.monotonic() - start:.0f} s, no network")


def _venv_seeing(venv: Path, python: str) -> Path:
    """``venv`` (made if missing, without pip: an image's Python may lack ``ensurepip``) seeing ``python``'s
    packages; returns its site-packages. ``--system-site-packages`` reaches only the base interpreter's packages,
    and a GPU image's ``python3`` is often itself a venv (the lent images': /opt/torch/.venv) whose packages hold
    torch, so those folders are added with ``site.addsitedir`` from a ``.pth`` file (their own ``.pth`` files
    run too), after the venv's own packages: the bundle's versions come first."""
    if not (venv / "bin" / "python").exists():
        subprocess.run([python, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    ask = ("import json, site, sysconfig; print(json.dumps([sysconfig.get_paths()['purelib'], "
           "[*site.getsitepackages(), site.getusersitepackages()]]))")
    dest = Path(json.loads(subprocess.run([str(venv / "bin" / "python"), "-c", ask], check=True,
                                          capture_output=True, text=True).stdout)[0])
    image = json.loads(subprocess.run([python, "-c", ask], check=True, capture_output=True, text=True).stdout)[1]
    folders = [f for f in image if Path(f).is_dir() and Path(f).resolve() != dest.resolve()]
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "zz_image_packages.pth").write_text(
        "".join(f"import site; site.addsitedir({f!r})\n" for f in folders))
    return dest


def _download(specs: Iterable[str], into: Path, python_version: str, binary: bool = True) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check",
           "--dest", str(into)]
    if binary:
        cmd += ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
        cmd += [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([*cmd, *specs], check=True, env={**os.environ, "PIP_CONSTRAINT": ""})


def build(torch_version: str, python_version: str, part_mib: float, out: Path) -> Dict[str, object]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from stacks import load_stacks

    minor = ".".join(torch_version.split("+")[0].split(".")[:2])
    stacks = [s for s in load_stacks().values() if ".".join(s.torch.split(".")[:2]) == minor]
    if not stacks:
        known = ", ".join(sorted({".".join(s.torch.split(".")[:2]) for s in load_stacks().values()}))
        raise SystemExit(f"error: TORCH={torch_version!r} is not allowed; expected the torch of a supported "
                         f"stack: {known}")
    stack = stacks[-1]
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-") as tmp:
        folder = Path(tmp) / "bundle"
        wheels, downloads = folder / "wheels", Path(tmp) / "downloads"
        for d in (wheels, downloads):
            d.mkdir(parents=True)
        print(f"[gpu-bundle] {stack.name} ({stack.versions()}) for Python {python_version}: downloading", flush=True)
        _download([f"fbgemm-gpu=={stack.fbgemm}"], downloads, python_version)
        _download([f"torchrec=={stack.torchrec}"], wheels, python_version)
        pins = runtime_pins()
        try:  # one resolver run for all; pin by pin only when some pin has no wheel for that Python
            _download(pins, wheels, python_version)
            pins = []
        except subprocess.CalledProcessError:
            pass
        for pin in pins:
            try:
                _download([pin], wheels, python_version)
            except subprocess.CalledProcessError:  # only a source release (pure Python): built into a wheel here
                source = Path(tempfile.mkdtemp(dir=tmp))
                _download([pin], source, python_version, binary=False)
                subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
                                str(wheels), str(next(source.iterdir()))], check=True)
        fbgemm = next(downloads.glob("fbgemm_gpu-*.whl"))
        with zipfile.ZipFile(fbgemm) as z:
            z.extractall(folder / "unpacked")
        print(f"[gpu-bundle] {len(list(wheels.glob('*.whl')))} wheels and FBGEMM ({fbgemm.stat().st_size / MIB:.0f} "
              f"MiB wheel) in {time.monotonic() - start:.0f} s; compressing", flush=True)
        manifest = pack(folder, out, int(part_mib * MIB),
                        {"stack": stack.name, "versions": stack.versions(), "python": python_version,
                         "torch": torch_version, "made": time.strftime("%Y-%m-%d %H:%M")})
    print(f"[gpu-bundle] {len(manifest['parts'])} parts of at most {part_mib:g} MiB "  # type: ignore[arg-type]
          f"({int(manifest['archive_bytes']) / MIB:.1f} MiB in all) in {out}, {time.monotonic() - start:.0f} s; "
          f"on the box: python3 benchmarks/gpu_bundle.py install --parts <folder of the parts>", flush=True)
    return manifest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="download and pack (needs the registry)")
    b.add_argument("--torch", required=True, help="the image's torch, e.g. 2.11.0")
    b.add_argument("--python", required=True, help="the image's Python, e.g. 3.12")
    b.add_argument("--part-mib", type=float, default=58.0)
    b.add_argument("--out", type=Path, default=ROOT / "outputs" / "gpu-bundle")
    i = sub.add_parser("install", help="install from the parts, no network")
    i.add_argument("--parts", type=Path, required=True, help="the folder holding manifest.json and the parts")
    i.add_argument("--target", type=Path, help="a folder to install into (then PYTHONPATH=<it>) instead of a venv")
    i.add_argument("--venv", type=Path, default=ROOT / ".venv")
    args = parser.parse_args()
    if args.command == "build":
        build(args.torch, args.python, args.part_mib, args.out.resolve())
    else:
        print(install(args.parts.resolve(), args.target.resolve() if args.target else None,
                      None if args.target else args.venv.resolve()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
