"""Criteo click logs: ``label \\t I1..I13 \\t C1..C26`` per line, split over ranks and workers by byte range.

Each line is read by the shard its first byte falls in (no pass over the data to count lines), parsed
4 MiB at a time by Arrow's CSV reader; hex categorical values are decoded from Arrow's buffers.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Iterator, Tuple

import numpy as np
from torchrec.datasets.utils import Batch

from runner.config.errors import DataError
from runner.data.files import CRITEO_DENSE, CRITEO_LAYOUT, CRITEO_SPARSE, bad_line, criteo_files
from runner.data.layout import make_batch, shard_range
from runner.data.sharded import ShardedSource

_HEX = np.zeros(256, dtype=np.uint64)
_HEX[list(b"0123456789abcdef")] = np.arange(16)
_HEX[list(b"ABCDEF")] = np.arange(10, 16)
_POWERS = np.array([16 ** (15 - i) for i in range(16)], dtype=np.uint64)


def hex_to_int(strings: Any) -> np.ndarray:
    """Hex strings (up to 16 digits; empty = 0) to unsigned integers, vectorised: a Python sequence or an
    Arrow string array (read from its buffers, no Python objects)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = strings if isinstance(strings, (pa.Array, pa.ChunkedArray)) else pa.array(list(strings), pa.string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    padded = pc.utf8_lpad(arr.fill_null(""), width=16, padding="0")
    if len(padded) and pc.max(pc.utf8_length(padded)).as_py() > 16:
        raise ValueError("a categorical value has more than 16 hex digits")
    padded = padded.cast(pa.string())
    offsets = np.frombuffer(padded.buffers()[1], dtype=np.int32)[padded.offset:padded.offset + len(padded) + 1]
    data = np.frombuffer(padded.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
    digits = _HEX[data.reshape(-1, 16)]
    return (digits * _POWERS).sum(axis=1, dtype=np.uint64)


class CriteoSource(ShardedSource):
    """Criteo click logs: ``label \\t I1..I13 \\t C1..C26`` per line (TSV, missing values empty).
    Dense: ``log(1 + max(x, 0))``; categorical: hex value modulo the feature's table size."""

    block_bytes = 4 << 20

    def __iter__(self) -> Iterator[Batch]:
        yield from self._rebatch(self._parse(path, block) for path, block in self._blocks())

    def _blocks(self) -> Iterator[Tuple[Path, bytes]]:
        """This shard's byte range of the concatenated files, as blocks of whole lines."""
        shard, shards = self._shard()
        files = criteo_files(self.path)
        sizes = [f.stat().st_size for f in files]
        lo, hi = shard_range(sum(sizes), shard, shards)
        offset = 0
        for path, size in zip(files, sizes, strict=True):
            start, end = max(lo - offset, 0), min(hi - offset, size)
            offset += size
            if start < end:
                yield from ((path, b) for b in _blocks_starting_in(path, start, end, self.block_bytes))

    def _parse(self, path: Path, block: bytes) -> Any:
        """Whole lines, parsed by Arrow's CSV reader (C++): label, 13 numbers, 26 strings."""
        import pyarrow as pa
        import pyarrow.csv as pcsv

        names = (["label"] + [f"I{j}" for j in range(1, CRITEO_DENSE + 1)]
                 + [f"C{j}" for j in range(1, CRITEO_SPARSE + 1)])
        types = {"label": pa.float32(), **{f"I{j}": pa.float64() for j in range(1, CRITEO_DENSE + 1)},
                 **{f"C{j}": pa.string() for j in range(1, CRITEO_SPARSE + 1)}}
        try:
            return pcsv.read_csv(
                io.BytesIO(block),
                read_options=pcsv.ReadOptions(column_names=names, use_threads=False, block_size=len(block) + 1),
                parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False),
                convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=False))
        except pa.ArrowInvalid as exc:
            raise DataError(bad_line(path) or f"{path}: not the Criteo layout ({CRITEO_LAYOUT}): "
                            f"{str(exc).splitlines()[0]}") from None

    def _batch(self, t: Any) -> Batch:
        def numbers(name: str) -> np.ndarray:  # missing values (null) -> NaN -> 0
            return np.nan_to_num(t.column(name).to_numpy(zero_copy_only=False), nan=0.0)

        labels = numbers("label")[:, None]
        dense = np.stack([numbers(f"I{j}") for j in range(1, CRITEO_DENSE + 1)], axis=1)
        dense = np.log1p(np.maximum(dense, 0.0))
        values = [self._ids((hex_to_int(t.column(f"C{j + 1}")) % np.uint64(self.lay.sizes[j])).astype(np.int64), j)
                  for j in range(CRITEO_SPARSE)]
        return make_batch(self.lay, labels, dense, np.ones((CRITEO_SPARSE, t.num_rows), np.int64),
                           np.concatenate(values))


def _blocks_starting_in(path: Path, start: int, end: int, block: int) -> Iterator[bytes]:
    """Blocks of whole lines of ``path``: every line whose first byte lies in ``[start, end)``, once."""
    with open(path, "rb") as f:
        if start > 0:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                f.readline()  # the line in progress belongs to the previous shard
        pos = f.tell()  # file offset of buf[0]
        buf = b""
        while pos < end:
            chunk = f.read(block)
            buf += chunk
            cut = len(buf) if not chunk else buf.rfind(b"\n") + 1  # whole lines only (all of it at EOF)
            keep = end - pos  # lines starting at buf[keep] or later belong to the next shard
            if cut > keep:
                line_end = buf.find(b"\n", keep - 1) if keep > 0 else -1
                cut = line_end + 1 if line_end >= 0 else (len(buf) if keep > 0 else 0)
                if cut:
                    yield buf[:cut]
                return
            if cut:
                yield buf[:cut]
            buf, pos = buf[cut:], pos + cut
            if not chunk:
                return


def criteo_lines(rows: int, seed: int = 0, missing: float = 0.1) -> str:
    """Criteo-layout TSV text with random values (for tests and trying the reader)."""
    rng = np.random.default_rng(seed)
    out = io.StringIO()
    for _ in range(rows):
        ints = rng.integers(-1, 1000, CRITEO_DENSE)
        cats = rng.integers(0, 2**32, CRITEO_SPARSE)
        label = int(rng.random() < 1 / (1 + np.exp(-(np.log1p(max(ints[0], 0)) - 3 + (cats[0] % 7) / 3))))
        fields = [str(label)] + ["" if rng.random() < missing else str(v) for v in ints] + [
            "" if rng.random() < missing else f"{v:08x}" for v in cats]
        out.write("\t".join(fields) + "\n")
    return out.getvalue()
