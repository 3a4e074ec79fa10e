"""A calibration in TorchRec's own terms: one self-contained Python file (TorchRec only, not the runner) that registers
a ``HardwarePerfConfig`` with ``EmbeddingPerfEstimatorFactory`` and defines a ``GeneralizedCommsBandwidth``, so that a
TorchRec user plans with the measured constants. It carries what a plan with the calibration gives TorchRec
(:func:`.topology.topology_knobs`, untrusted parts fallen back, :func:`.trust.fallen_back`): the
device's memory bandwidth and backward multiplier, a GPU's host-to-GPU bandwidth, and each collective's measured
bandwidth per scope (``BasicCommsBandwidths``' answer where not measured). TorchRec's model has no fixed cost per call
or collective, no dense part and no backward saved where a step's ids repeat rows (the multiplier is a backward whose
ids are all distinct rows, TorchRec's own assumption; ``bwd_row_share``): those stay the runner's. Written beside
``calibration.yaml`` by ``mode=calibrate``, and by ``python -m runner export-calibration``."""

from __future__ import annotations

import dataclasses
import pprint
import re
import string
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Optional

from runner.config.errors import first_line
from runner.plan.cost.calibration import Calibration, load_calibration, whole_or_refused
from runner.plan.cost.topology import TORCHREC_SCOPES, gibps_to_bytes_per_ms, topology_knobs
from runner.plan.cost.trust import fallen_back

FILE_NAME = "calibration_torchrec.py"  # beside calibration.yaml in a run folder
HOOKS_SINCE = "1.6.1"  # the first TorchRec with both hooks: every stack of requirements/stacks.toml (wheels checked)
COMMAND = "python -m runner export-calibration <calibration.yaml> [out.py]"


def torchrec_hooks_missing() -> Optional[str]:
    """None where the installed TorchRec has a per-hardware perf config and a per-collective comms bandwidth (asked
    by importing them, not by version); else the one line that says so and names the stacks that have them."""
    try:
        from torchrec.distributed.planner.estimator import EmbeddingPerfEstimatorFactory  # noqa: F401
        from torchrec.distributed.planner.types import BasicCommsBandwidths, CollectiveType  # noqa: F401
    except ImportError:
        import torchrec

        return (f"TorchRec {getattr(torchrec, '__version__', '(unknown version)')} has no HardwarePerfConfig or "
                "GeneralizedCommsBandwidth (torchrec.distributed.planner.estimator), so a calibration cannot be "
                f"exported in its terms: TorchRec {HOOKS_SINCE} on has them (the torchrec-1.6 stack and every newer "
                "one of requirements/stacks.toml, the pinned torchrec-1.9 included)")
    return None


def export_values(cal: Calibration) -> Dict[str, Any]:
    """The numbers the exported file holds, in TorchRec's units (bytes per ms), from what of ``cal`` a plan uses:
    ``None`` where a part fell back (TorchRec's own value then stays)."""
    used = fallen_back(cal)
    kind = str(cal.fingerprint.get("device_kind", "cpu"))
    knobs, _ = topology_knobs(used, kind, None, None)
    # the intra/inter numbers BasicCommsBandwidths answers with where a collective was not measured: the measured
    # all-to-all's (else TorchRec's); world 2 over 1 per node skips the one-node all-reduce stand-in for inter_host_bw,
    # since the measured all-reduce is answered as itself here
    _, host = topology_knobs(used, kind, None, None, world=2, local=1)
    measured: Dict[str, Dict[str, float]] = {}
    latency: Dict[str, Dict[str, float]] = {}
    for name, by_scope in (used.constants.get("collectives") or {}).items():
        for scope, fit in by_scope.items():
            if scope in TORCHREC_SCOPES and fit.get("bandwidth_gibps"):  # None: no growth with the bytes
                measured.setdefault(name, {})[scope] = gibps_to_bytes_per_ms(float(fit["bandwidth_gibps"]))
                latency.setdefault(name, {})[scope] = float(fit.get("latency_ms") or 0.0)
    c, fp = used.constants, cal.fingerprint
    slug = re.sub(r"[^a-z0-9]+", "-", f"{kind} {fp.get('device_name', '')}".lower()).strip("-")[:48]
    return {"name": f"runner-{slug}-{fp.get('nodes')}x{fp.get('workers_per_node')}-"
                    f"{re.sub(r'[^0-9]', '', cal.made)[:14] or 'unmade'}",
            "device_kind": kind,
            "device_mem_bw": knobs.get("hbm_mem_bw" if kind == "cuda" else "ddr_mem_bw"),
            "bwd_compute_multiplier": knobs.get("bwd_compute_multiplier"),
            "hbm_to_ddr_mem_bw": knobs.get("hbm_to_ddr_mem_bw"),
            "intra_host_bw": gibps_to_bytes_per_ms(host["intra"]),
            "inter_host_bw": gibps_to_bytes_per_ms(host["cross"]),
            "measured_bw": measured, "latency_ms": latency,
            "kernel_call_ms": ({"fwd": float(c["kernel_call_fwd_ms"]), "bwd": float(c["kernel_call_bwd_ms"])}
                               if "kernel_call_fwd_ms" in c else {}),
            "fell_back": sorted(cal.untrusted())}


def torchrec_export_text(cal: Calibration) -> str:
    """The exported file's text (:data:`_TEMPLATE`, filled with :func:`export_values` as Python literals)."""
    v = export_values(cal)
    fp = cal.fingerprint
    fell = ", ".join(v["fell_back"]) or "none"
    source = (f"{cal.path or '(in memory)'}: {fp.get('device_name')} ({v['device_kind']}), {fp.get('nodes')} x "
              f"{fp.get('workers_per_node')} workers, TorchRec {fp.get('torchrec')}, made {cal.made}; parts that "
              f"fell back to TorchRec's constants: {fell}")
    return string.Template(_TEMPLATE).substitute(
        SOURCE=textwrap.fill(source, 116), NAME=repr(v["name"]), DEVICE_KIND=repr(v["device_kind"]),
        DEVICE_MEM_BW=repr(v["device_mem_bw"]), BWD=repr(v["bwd_compute_multiplier"]),
        H2D=repr(v["hbm_to_ddr_mem_bw"]), INTRA=repr(v["intra_host_bw"]), INTER=repr(v["inter_host_bw"]),
        **{key: pprint.pformat(v[name], width=72) for key, name in (
            ("MEASURED", "measured_bw"), ("LATENCY", "latency_ms"), ("KERNEL_CALL", "kernel_call_ms"))},
        SINCE=HOOKS_SINCE)


def write_torchrec_export(cal: Calibration, path: Path) -> Path:
    """Write ``cal``'s TorchRec export to ``path`` (whole: written aside, then moved into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(torchrec_export_text(cal))
    part.replace(path)
    return path


def export_beside(cal: Calibration, written: Path) -> str:
    """``mode=calibrate``'s export of ``cal``, beside the file it was ``written`` to (``calibration/``, whose files are
    logged); the line that says where, or why there is none (a TorchRec without the hooks)."""
    missing = torchrec_hooks_missing()
    if missing is not None:
        return f"not exported for TorchRec's own planner: {missing}"
    where = write_torchrec_export(dataclasses.replace(cal, path=str(written)), written.with_name(FILE_NAME))
    return f"for TorchRec's own planner (no runner needed): {where} (its docstring says how to plan with it)"


def default_export_path(calibration: Path) -> Path:
    """Where ``export-calibration`` writes when no ``out.py`` is given: beside the calibration, named after it as an
    importable module (``calibration.yaml`` -> ``calibration_torchrec.py``)."""
    stem = re.sub(r"\.calibration$", "", re.sub(r"\.ya?ml$", "", calibration.name))
    stem = re.sub(r"\W+", "_", stem).strip("_") or "calibration"
    return calibration.with_name(("calibration_" if stem[0].isdigit() else "") + f"{stem}_torchrec.py")


def export_calibration_command(args: List[str]) -> int:
    """``python -m runner export-calibration <calibration.yaml> [out.py]``: the exit status (2 and one line on
    stderr when the file cannot be exported)."""
    def refuse(why: str) -> int:
        print(f"error: {why}", file=sys.stderr)
        return 2
    if not 1 <= len(args) <= 2 or any(a.startswith("-") for a in args):
        return refuse(f"expected {COMMAND}, got {' '.join(args) or 'no arguments'}")
    source = Path(args[0])
    out = Path(args[1]) if len(args) == 2 else default_export_path(source)
    if out.suffix != ".py":
        return refuse(f"export-calibration {args[0]} {out}: the TorchRec export is a Python file; name one ending "
                      "in .py")
    missing = torchrec_hooks_missing()
    if missing is not None:
        return refuse(missing)
    try:
        cal = whole_or_refused(load_calibration(source))
    except ValueError as exc:  # ConfigError: the calibration's own one line, its key and why
        why = first_line(exc).split(" cannot be used: ", 1)[-1].split("; make one on this machine", 1)[0]
        return refuse(f"{source} cannot be exported: {why}; make one with python -m runner mode=calibrate")
    try:
        where = write_torchrec_export(cal, out)
    except OSError as exc:
        return refuse(f"export-calibration {args[0]} {out}: cannot write it ({exc.strerror or first_line(exc)}); "
                      "name a writable out.py")
    v = export_values(cal)
    print(f"[runner] TorchRec export of {source}: {where} (registered as {v['name']!r}; parts that fell back to "
          f"TorchRec's constants: {', '.join(v['fell_back']) or 'none'}; its docstring says how to plan with it)")
    return 0


_TEMPLATE = '''"""TorchRec's planner with one machine's measured constants (a calibration exported by the runner).

From $SOURCE.

Importing this file registers ``NAME`` with TorchRec's ``EmbeddingPerfEstimatorFactory`` (``CalibratedPerfConfig``:
the device's memory bandwidth that FBGEMM's fused kernel reaches and the backward multiplier, as measured) and
defines ``CalibratedCommsBandwidth`` (each collective's measured bandwidth per scope, within a node or across nodes;
TorchRec's ``BasicCommsBandwidths`` with the measured all-to-all's numbers where a collective was not measured). It
needs TorchRec only (TorchRec $SINCE or newer). Plan with it::

    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator

    import calibration_torchrec as calibrated  # this file

    topology = calibrated.topology(world_size=16, local_world_size=8)  # Topology's own keywords go through
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=512,
                                     estimator=[calibrated.perf_estimator(topology),
                                                EmbeddingStorageEstimator(topology=topology)])
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=512, enumerator=enumerator)
    plan = planner.plan(model, sharders)

(``EmbeddingPerfEstimatorFactory.create(calibrated.NAME, topology=topology)`` is ``perf_estimator``; a ``Topology`` of
your own takes ``generalized_comms_bandwidths=calibrated.CalibratedCommsBandwidth()``.) Bandwidths are TorchRec's
units, bytes per millisecond. TorchRec's model has no fixed cost per kernel call or collective: ``KERNEL_CALL_MS`` and
``LATENCY_MS`` are recorded here, not used.
"""

from typing import Any, Dict, Optional

try:
    from torchrec.distributed.planner.estimator import EmbeddingPerfEstimatorConfig, EmbeddingPerfEstimatorFactory
    from torchrec.distributed.planner.types import (
        BasicCommsBandwidths,
        CollectiveType,
        GeneralizedCommsBandwidth,
        Topology,
    )
except ImportError as exc:  # an older TorchRec: one line, naming what it needs
    raise ImportError(f"this calibration plans with TorchRec's per-hardware perf config and comms bandwidths, which "
                      f"the installed TorchRec lacks ({exc}): install TorchRec $SINCE or newer") from None

NAME = $NAME
DEVICE_KIND = $DEVICE_KIND
DEVICE_MEM_BW: Optional[float] = $DEVICE_MEM_BW  # None: the kernels fell back, TorchRec's (the topology's) stays
BWD_COMPUTE_MULTIPLIER: Optional[float] = $BWD
HBM_TO_DDR_MEM_BW: Optional[float] = $H2D  # the UVM-caching kernel's host-to-GPU bandwidth (a GPU's only)
INTRA_HOST_BW: float = $INTRA  # where a collective was not measured (BasicCommsBandwidths' two numbers)
INTER_HOST_BW: float = $INTER
# {collective: {"intra" | "cross": bytes per ms}}; then, recorded and not used by TorchRec, their latencies and the
# fused kernel's fixed cost per call (ms)
MEASURED_BW: Dict[str, Dict[str, float]] = $MEASURED
LATENCY_MS: Dict[str, Dict[str, float]] = $LATENCY
KERNEL_CALL_MS: Dict[str, float] = $KERNEL_CALL


class CalibratedCommsBandwidth(GeneralizedCommsBandwidth):
    """Each collective's measured bandwidth for its scope (all ranks on one node: ``intra``; else ``cross``), as the
    calibration's ranks attained it (an all-reduce's is its own, not one NIC's per GPU); TorchRec's
    ``BasicCommsBandwidths`` answer with ``INTRA_HOST_BW``/``INTER_HOST_BW`` where it was not measured."""

    def __init__(self, intra_host_bw: float = INTRA_HOST_BW, inter_host_bw: float = INTER_HOST_BW,
                 measured: Optional[Dict[str, Dict[str, float]]] = None) -> None:
        self.name = "CalibratedCommsBandwidth"
        self._basic = BasicCommsBandwidths(inter_host_bw=inter_host_bw, intra_host_bw=intra_host_bw)
        self._measured = dict(MEASURED_BW if measured is None else measured)

    @property
    def intra_host_bw(self) -> float:
        return self._basic.intra_host_bw

    @property
    def inter_host_bw(self) -> float:
        return self._basic.inter_host_bw

    def get_bw(self, local_world_size: int, world_size: int, collective_type: CollectiveType) -> float:
        scope = "intra" if world_size <= local_world_size else "cross"
        bw = self._measured.get(collective_type.value, {}).get(scope)
        return bw if bw else self._basic.get_bw(local_world_size, world_size, collective_type)

    def __str__(self) -> str:
        return f"{self.name}: {NAME}, measured={self._measured}, {self._basic}"

    def __hash__(self) -> int:
        return hash((str(self._basic), repr(sorted(self._measured.items()))))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CalibratedCommsBandwidth) and str(self) == str(other)


@EmbeddingPerfEstimatorFactory.register(NAME)
class CalibratedPerfConfig(EmbeddingPerfEstimatorConfig):
    """TorchRec's default perf config (its coefficients) with this machine's device bandwidth and backward
    multiplier; a device other than ``DEVICE_KIND`` keeps the topology's."""

    name = NAME
    _bwd_compute_multiplier = BWD_COMPUTE_MULTIPLIER  # None: the topology's
    hbm_to_ddr_mem_bw = HBM_TO_DDR_MEM_BW
    # the measured memory bandwidth on the class (TorchRec reads the topology's: get_device_bw below applies it)
    ddr_mem_bw = DEVICE_MEM_BW if DEVICE_KIND == "cpu" and DEVICE_MEM_BW else EmbeddingPerfEstimatorConfig.ddr_mem_bw
    hbm_mem_bw = DEVICE_MEM_BW if DEVICE_KIND != "cpu" and DEVICE_MEM_BW else EmbeddingPerfEstimatorConfig.hbm_mem_bw

    def get_device_bw(self, compute_device: str, compute_kernel: str, hbm_mem_bw: float, ddr_mem_bw: float,
                      ssd_mem_bw: float, hbm_to_ddr_mem_bw: float, caching_ratio: Optional[float] = None,
                      prefetch_pipeline: bool = False) -> Optional[float]:
        # TorchRec passes the topology's memory bandwidths: the measured device's stand in for them, so every
        # kernel's bandwidth (fused, dense at half, UVM caching's mix) follows TorchRec's own lookup
        if compute_device.lower() == DEVICE_KIND:
            if DEVICE_MEM_BW is not None:
                ddr_mem_bw, hbm_mem_bw = ((DEVICE_MEM_BW, hbm_mem_bw) if DEVICE_KIND == "cpu"
                                          else (ddr_mem_bw, DEVICE_MEM_BW))
            if HBM_TO_DDR_MEM_BW is not None:
                hbm_to_ddr_mem_bw = HBM_TO_DDR_MEM_BW
        return super().get_device_bw(compute_device, compute_kernel, hbm_mem_bw, ddr_mem_bw, ssd_mem_bw,
                                     hbm_to_ddr_mem_bw, caching_ratio, prefetch_pipeline)


def topology(world_size: int, local_world_size: int, compute_device: str = DEVICE_KIND, **kwargs: Any) -> Topology:
    """TorchRec's ``Topology`` with the measured constants (for TorchRec code that reads them off the topology) and
    ``CalibratedCommsBandwidth``; ``kwargs``: any other ``Topology`` keyword (``hbm_cap``, ``ddr_cap``, ...)."""
    knobs: Dict[str, Any] = {"intra_host_bw": INTRA_HOST_BW, "inter_host_bw": INTER_HOST_BW,
                             "generalized_comms_bandwidths": CalibratedCommsBandwidth()}
    if compute_device == DEVICE_KIND and DEVICE_MEM_BW is not None:
        knobs["ddr_mem_bw" if DEVICE_KIND == "cpu" else "hbm_mem_bw"] = DEVICE_MEM_BW
    if compute_device == DEVICE_KIND and BWD_COMPUTE_MULTIPLIER is not None:
        knobs["bwd_compute_multiplier"] = BWD_COMPUTE_MULTIPLIER
    if compute_device == DEVICE_KIND and HBM_TO_DDR_MEM_BW is not None:
        knobs["hbm_to_ddr_mem_bw"] = HBM_TO_DDR_MEM_BW
    return Topology(world_size=world_size, local_world_size=local_world_size, compute_device=compute_device,
                    **{**knobs, **kwargs})


def perf_estimator(topology: Topology, constraints: Optional[Dict[str, Any]] = None) -> Any:
    """TorchRec's embedding perf estimator with ``CalibratedPerfConfig``, for ``EmbeddingEnumerator(estimator=...)``."""
    return EmbeddingPerfEstimatorFactory.create(NAME, topology=topology, constraints=constraints)

'''
