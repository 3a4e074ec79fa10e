"""Data files on a local disk or in an object store, read through ``pyarrow.fs``.

``data.path`` may be a local path, ``file://``, ``s3://``, ``gs://`` or ``hdfs://`` (pyarrow's own
filesystems, configured as their clients are: ``AWS_*`` variables and ``~/.aws`` for S3, including
``AWS_ENDPOINT_URL`` for an S3-compatible server; Google's application credentials for GCS; ``HADOOP_HOME``
and ``CLASSPATH`` for HDFS), or any other scheme fsspec has a filesystem for (``abfs://``, ``az://``, ...,
when that fsspec package is installed). A folder is searched recursively.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Tuple

from runner.config.errors import DataError, first_line

CRITEO_DENSE, CRITEO_SPARSE = 13, 26
CRITEO_LAYOUT = "40 tab-separated fields: label, 13 integer, 26 hex categorical"
_ARROW_SCHEMES = ("s3://", "gs://", "gcs://", "hdfs://", "viewfs://")


@dataclass(frozen=True)
class DataFile:
    """One file: its filesystem, its path there, the address a user reads, its size and modification time."""

    fs: Any
    path: str
    uri: str
    size: int
    mtime_ns: int

    def open(self) -> Any:
        """A seekable binary file (what ``pyarrow.parquet`` reads footers and row groups from)."""
        return self.fs.open_input_file(self.path)

    def __str__(self) -> str:
        return self.uri


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def filesystem(uri: str) -> Tuple[Any, str]:
    """``(filesystem, path in it)`` for a data path or URI."""
    import pyarrow.fs as pafs

    if not is_remote(uri):
        local = uri[len("file://"):] if uri.startswith("file://") else uri
        return pafs.LocalFileSystem(), str(Path(local).expanduser().resolve())
    try:
        if uri.startswith("s3://"):
            return _s3(uri)
        if uri.startswith(_ARROW_SCHEMES):
            return pafs.FileSystem.from_uri(uri)
        import fsspec

        fs, path = fsspec.core.url_to_fs(uri)
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path
    except Exception as exc:
        raise DataError(f"data.path={uri}: no filesystem for it ({first_line(exc)})") from None


def _s3(uri: str) -> Tuple[Any, str]:
    """pyarrow's S3 filesystem; ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (as boto3 reads them) name an
    S3-compatible server unless the URI sets ``?endpoint_override=``."""
    import os
    from urllib.parse import urlsplit

    import pyarrow.fs as pafs

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not endpoint or "endpoint_override=" in uri:
        return pafs.FileSystem.from_uri(uri)
    parts = urlsplit(uri)
    ep = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
    fs = pafs.S3FileSystem(endpoint_override=ep.netloc, scheme=ep.scheme or "https",
                           region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
    return fs, f"{parts.netloc}{parts.path}".rstrip("/")


def find_files(uri: str, suffixes: Tuple[str, ...]) -> List[DataFile]:
    """The files at ``uri`` (itself, or a folder's files ending in ``suffixes``, recursively), by path."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri)
    try:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            infos = [i for i in fs.get_file_info(pafs.FileSelector(path, recursive=True))
                     if i.type == pafs.FileType.File and i.path.endswith(suffixes)]
        else:
            infos = [info] if info.type == pafs.FileType.File else []
    except Exception as exc:  # credentials, network, a missing bucket
        raise DataError(f"data.path={uri}: cannot list it ({first_line(exc)[:300]})") from None
    base = uri.rstrip("/")
    out = []
    for i in sorted(infos, key=lambda i: i.path):
        rest = i.path[len(path):].lstrip("/")
        shown = i.path if not is_remote(uri) else (f"{base}/{rest}" if rest else uri)
        out.append(DataFile(fs, i.path, shown, int(i.size or 0), int(i.mtime_ns or 0)))
    return out


def parquet_files(path: str) -> List[DataFile]:
    """``path`` itself, or the ``*.parquet`` files of a folder (local or in an object store, :mod:`.files`)."""
    return find_files(path, (".parquet",))


def criteo_files(path: str) -> List[Path]:
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        return []
    return sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))


def bad_line(path: Path) -> Optional[str]:
    """``<file> line N has K fields; ...`` for the first line of ``path`` that is not the Criteo layout."""
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            fields = line.rstrip(b"\r\n").count(b"\t") + 1
            if fields != 1 + CRITEO_DENSE + CRITEO_SPARSE:
                return f"{path} line {n} has {fields} fields; Criteo lines have {CRITEO_LAYOUT}"
    return None
