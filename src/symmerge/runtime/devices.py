"""Where a forward runs and in which precision: `--device` and `--dtype`, resolved and checked in one place.

- `--device cpu|cuda|cuda:N`: default cuda (the current GPU) when one is visible, else cpu.
- `--dtype float32|bfloat16|float16`: the endpoints' working precision in the forward; default: the
  checkpoint's own storage dtype (`Placement.working`).

What the flags never change: group parameters, their optimiser state and the exact algebra (canonical
forms, group actions, interpolation) stay float32/float64; training keeps float32 master weights and
runs the forward under autocast (`autocast`); written checkpoints keep their input's dtype unless
`--out-dtype` says otherwise.

Checks, all before any work (`resolve`): a GPU asked for where none is visible, an index beyond the
visible count, and a dtype the device cannot run refuse with one `SymmergeError` line. Whether a device
runs a dtype is found out by running a tiny forward and backward in it (`probe`), not from a table: a
table would guess wrong for the next build or chip.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import SymmergeError

#: the --dtype choices (float64 is the algebra's precision, not a working precision)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICE_SYNTAX = re.compile(r"cpu|cuda(:\d+)?")


def device_name(text: str) -> str:
    """argparse type of --device: the syntax only (cpu, cuda, cuda:N); what is visible is `resolve`'s."""
    text = str(text).strip().lower()
    if not DEVICE_SYNTAX.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not cpu, cuda or cuda:N")
    return text


def add_arguments(p, what: str = "the forward", dtype_default: str | None = None, dtype_help: str | None = None) -> None:
    """--device and --dtype on parser `p`; `what` says in the help what runs there. `dtype_default` (and
    `dtype_help`): for a command without an input checkpoint (train), the dtype when --dtype is not given."""
    p.add_argument("--device", type=device_name, default=None,
                   help=f"where {what} runs: cpu, cuda or cuda:N (default: cuda when a GPU is visible, else cpu)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default=dtype_default, help=dtype_help or (
                   f"working precision of {what} (default: the checkpoint's own dtype); group parameters, optimiser "
                   "state and the exact algebra stay float32/float64, written checkpoints keep their input's dtype"))


@dataclass(frozen=True)
class Placement:
    """A resolved --device and --dtype: `dtype` None means the checkpoint's own (see `working`)."""

    device: torch.device
    dtype: torch.dtype | None = None

    def working(self, storage: torch.dtype) -> torch.dtype:
        """The forward's dtype for a checkpoint stored in `storage`, checked to run on the device."""
        dtype = self.dtype or storage
        check_dtype(self.device, dtype)
        return dtype

    def record(self, dtype: torch.dtype) -> dict:
        """{"device", "dtype"} as reports record them (and as `LearnConfig` takes them)."""
        return {"device": str(self.device), "dtype": dtype_name(dtype)}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def resolve_device(name: str | None) -> torch.device:
    """torch.device of a --device value (None: cuda when a GPU is visible, else cpu); refuses a GPU that
    is not there."""
    name = device_name(name) if name is not None else "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SymmergeError(f"--device {name}: no CUDA GPU is visible (torch.cuda.is_available() is False; "
                            f"torch {torch.__version__}); use --device cpu")
    count = torch.cuda.device_count()
    index = int(name.split(":")[1]) if ":" in name else torch.cuda.current_device()
    if index >= count:
        raise SymmergeError(f"--device {name}: only {count} GPU(s) visible (cuda:0 to cuda:{count - 1}); "
                            "pick one of those or set CUDA_VISIBLE_DEVICES")
    # deterministic cuBLAS (train turns deterministic algorithms on); read when CUDA first starts
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return torch.device("cuda", index)


def probe(device: torch.device, dtype: torch.dtype) -> None:
    """A tiny forward and backward of the operations a Transformer uses, in `dtype` on `device`; raises
    what the device raises when it cannot run them."""
    x = torch.linspace(-1, 1, 16, device=device).reshape(4, 4).to(dtype).requires_grad_(True)
    h = F.layer_norm(F.gelu(x @ x.T), (4,))
    loss = F.cross_entropy(h.softmax(-1).float(), torch.arange(4, device=device))
    loss.backward()
    if not torch.isfinite(x.grad.float()).all():
        raise RuntimeError("non-finite gradient")


def check_dtype(device: torch.device, dtype: torch.dtype) -> None:
    """Refuse a dtype `device` cannot run (found by `probe`)."""
    try:
        probe(device, dtype)
    except (RuntimeError, NotImplementedError, TypeError) as e:
        name = dtype_name(dtype)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SymmergeError(f"--dtype {name} does not run on {device} ({first}); choose another --dtype or "
                            "--device") from None


def resolve(args) -> Placement:
    """The Placement of a command's --device and --dtype (absent flags: their defaults), checked: call it
    first in a command's run, before anything is read or written."""
    return placement(getattr(args, "device", None), getattr(args, "dtype", None))


def placement(device: str | None = None, name: str | None = None) -> Placement:
    """The Placement of a device ("cpu", "cuda", "cuda:N"; None: cuda when a GPU is visible) and a working
    dtype (a `DTYPES` name; None: the checkpoint's own), checked."""
    device = resolve_device(device)
    if name is not None and name not in DTYPES:
        raise SymmergeError(f"--dtype must be one of {', '.join(DTYPES)}, not {name!r}")
    dtype = None if name is None else DTYPES[name]
    if dtype is not None:
        check_dtype(device, dtype)
    return Placement(device, dtype)


def autocast(device: torch.device, dtype: torch.dtype):
    """The training habit: float32 master weights, the forward under autocast to `dtype` (a no-op context
    for float32)."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
