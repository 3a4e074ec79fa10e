"""Every value the ``precision`` group's keys may take, each declared once, here.

- autocast (``precision.autocast``): torch's dtype of that name, whether loss scaling is on by default with it
  (``precision.grad_scaler.enabled: null``), and the compute capability from which a GPU computes in it (below it
  torch emulates it, many times slower, and a job is refused before anything starts);
- table storage (``precision.embedding_dtype``): FBGEMM's ``SparseType`` (TorchRec's ``DataType``) member;
- quantised collectives (``precision.qcomm_forward``, ``precision.qcomm_backward``): TorchRec's ``CommType`` member.

The schema's allowed values, the loss scaling's default, the GPU check, the tables and the sharders' codecs read
these; nothing else names a precision value. A preset (``conf/precision/<name>.yaml``) combines them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Autocast:
    name: str
    """torch's dtype (``torch.<name>``)."""
    short: str
    """How messages and presets call it (``bf16``)."""
    loss_scaling: bool = False
    """Loss scaling on when ``precision.grad_scaler.enabled`` is null (a narrow exponent underflows gradients)."""
    hardware_from: Optional[Tuple[int, int]] = None
    """The CUDA compute capability from which GPUs compute in it (None: every GPU)."""


@dataclass(frozen=True)
class Stored:
    name: str
    member: str
    """The member of TorchRec's ``DataType`` (tables) or ``CommType`` (collectives)."""


AUTOCASTS: Dict[str, Autocast] = {a.name: a for a in (
    Autocast("bfloat16", "bf16", hardware_from=(8, 0)),  # Ampere and later
    Autocast("float16", "fp16", loss_scaling=True),
)}
TABLE_DTYPES: Dict[str, Stored] = {s.name: s for s in (Stored("fp32", "FP32"), Stored("fp16", "FP16"))}
COMM_DTYPES: Dict[str, Stored] = {s.name: s for s in (Stored("fp16", "FP16"), Stored("bf16", "BF16"))}


def loss_scaling_by_default(autocast: Optional[str]) -> bool:
    """Whether loss scaling is on when ``precision.grad_scaler.enabled`` is null."""
    return autocast is not None and AUTOCASTS[autocast].loss_scaling


def in_hardware(autocast: Optional[str], capability: Tuple[int, int]) -> bool:
    """Whether a GPU of this compute capability computes in ``autocast`` (fp32 everywhere). torch's
    ``is_bf16_supported()`` also counts the emulation older GPUs get."""
    needs = AUTOCASTS[autocast].hardware_from if autocast is not None else None
    return needs is None or tuple(capability) >= needs


def autocast_notes() -> Dict[str, str]:
    """What ``--help`` says of each autocast dtype beyond its name."""
    said = {a.name: (["with loss scaling"] if a.loss_scaling else []) + (
        [f"GPUs from compute capability {'.'.join(map(str, a.hardware_from))}"] if a.hardware_from else [])
        for a in AUTOCASTS.values()}
    return {name: ", ".join(words) for name, words in said.items() if words}
