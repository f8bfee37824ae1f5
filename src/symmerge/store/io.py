"""Checkpoint I/O: lazy safetensors reading (single file or sharded) and atomic, sharded writing.

Never unpickles: a folder with only `pytorch_model.bin` is refused with instructions to convert it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..errors import SymmergeError
from ..runtime.atomic import AtomicFolder, AtomicFolders, clean_stale, remove_pending  # noqa: F401  (the writers' home)

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
#: files of a checkpoint folder that are not weights or config, copied to every output
SIDE_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "tokenizer.model", "added_tokens.json", "preprocessor_config.json", "generation_config.json", "symmerge.json",
)


class Checkpoint:
    """A Hugging Face checkpoint folder, read lazily one tensor at a time."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_dir():
            raise SymmergeError(f"{self.path} is not a folder; pass a Hugging Face checkpoint folder (config.json + *.safetensors)")
        if not (self.path / "config.json").is_file():
            raise SymmergeError(f"{self.path} has no config.json; pass a Hugging Face checkpoint folder")
        self.config = load_config(self.path)
        self._handles: dict[str, object] = {}
        self._files = self._weight_map()

    def _weight_map(self) -> dict[str, Path]:
        index, single = self.path / INDEX, self.path / WEIGHTS
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise SymmergeError(f"{index} is not a valid safetensors index ({e}); re-save the checkpoint") from None
            files = {k: self.path / v for k, v in weight_map.items()}
            missing = sorted({str(f.name) for f in files.values() if not f.is_file()})
            if missing:
                raise SymmergeError(f"{self.path}: shards {missing} named in {INDEX} are missing; copy the complete checkpoint")
            for shard in sorted(set(files.values())):  # headers only: cheap, and every later read can trust the index
                absent = sorted(set(k for k, f in files.items() if f == shard) - set(self._open(shard).keys()))
                if absent:
                    raise SymmergeError(f"{shard} lacks {len(absent)} tensor(s) that {INDEX} places there (first: "
                                        f"{absent[0]}); the index does not match its shards: re-save or re-copy the checkpoint")
            return files
        if single.is_file():
            return {k: single for k in self._open(single).keys()}
        if list(self.path.glob("*.bin")) or list(self.path.glob("*.pt")):
            raise SymmergeError(
                f"{self.path} holds only pickled weights (*.bin); symmerge never unpickles. Convert once, in an "
                "environment you trust: AutoModel.from_pretrained(path).save_pretrained(path, safe_serialization=True)"
            )
        raise SymmergeError(f"{self.path} has no {WEIGHTS} or {INDEX}")

    def _open(self, file: Path):
        key = str(file)
        if key not in self._handles:
            try:
                self._handles[key] = safe_open(key, framework="pt")
            except (SafetensorError, OSError, Exception) as e:  # safetensors raises several types
                raise SymmergeError(f"cannot read {file}: {e} (truncated or corrupt file?); re-copy the checkpoint") from None
        return self._handles[key]

    def names(self) -> list[str]:
        return list(self._files)

    def close(self) -> None:
        """Drop the open files (and their memory maps); they reopen on the next read."""
        self._handles.clear()

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def get(self, name: str) -> torch.Tensor:
        """One tensor, as stored (fp32/fp16/bf16/fp64)."""
        if name not in self._files:
            raise SymmergeError(f"{self.path}: tensor {name} is missing; the checkpoint does not match its config")
        try:
            return self._open(self._files[name]).get_tensor(name)
        except SafetensorError as e:
            raise SymmergeError(f"cannot read tensor {name} from {self._files[name]}: {e}; re-copy the checkpoint") from None

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every stored tensor's shape, read from the file headers."""
        return {n: tuple(self._open(f).get_slice(n).get_shape()) for n, f in self._files.items()}

    def dtype(self) -> torch.dtype:
        """The storage dtype of the first floating tensor (what outputs are written in)."""
        for name in self._files:
            f = self._open(self._files[name])
            t = f.get_slice(name)
            dt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}.get(t.get_dtype())
            if dt is not None:
                return dt
        return torch.float32


def load_config(path: Path):
    """The HF config of a local folder (defaults filled in by its config class); never remote code."""
    from transformers import AutoConfig

    try:
        raw = json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise SymmergeError(f"{path / 'config.json'} is not valid JSON ({e})") from None
    if "model_type" not in raw:
        raise SymmergeError(f"{path / 'config.json'} has no model_type; is this a Hugging Face checkpoint?")
    try:
        return AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (ValueError, KeyError, OSError) as e:
        raise SymmergeError(f"cannot load {path / 'config.json'}: {str(e).splitlines()[0]}") from None


def prepare_output(out: str | os.PathLike, force: bool, inputs=()) -> Path:
    """Refuse an OUT that cannot or must not be written, before any work; return the path (nothing is
    created yet).

    Refused: a non-empty OUT without `force`; an OUT equal to, inside, or (with `force`) holding one of
    `inputs` (inputs are never modified); an OUT whose nearest existing ancestor is a file or is not
    writable. Leftovers of a killed earlier write into the same OUT are cleaned first (`clean_stale`).
    """
    out = Path(out)
    for src in inputs:
        _refuse_overlap(out, Path(src), force)
    ancestor = out.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise SymmergeError(f"cannot create {out}: {ancestor} is a file, not a folder; choose another output folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise SymmergeError(f"cannot write {out}: no write permission in {ancestor}; choose another output folder")
    _probe(out, ancestor)
    clean_stale(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise SymmergeError(f"{out} exists and is not empty; choose another folder or pass --force to replace it")
    return out


def _probe(out: Path, ancestor: Path) -> None:
    """Create and remove an empty folder in `ancestor`: what the permission bits do not tell (root, a read-only
    mount, /proc or /sys) is found before any work, not when the first temporary folder is made."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=ancestor))
    except OSError as e:
        raise SymmergeError(f"cannot write {out}: {ancestor} takes no new folders ({e.strerror}); "
                            "choose another output folder") from None


def _refuse_overlap(out: Path, src: Path, force: bool) -> None:
    o, s = out.resolve(), src.resolve()
    if o == s:
        raise SymmergeError(f"output {out} is the input {src}; inputs are never modified: choose another output folder")
    if s in o.parents:
        raise SymmergeError(f"output {out} lies inside the input {src}; inputs are never modified: choose another output folder")
    if o in s.parents and force:
        raise SymmergeError(f"--force would replace {out}, which holds the input {src}; choose another output folder")


class ShardWriter:
    """Safetensors shards written as tensors arrive (a new shard past `max_shard_bytes`); `finish` names
    them `model-0000k-of-0000n.safetensors` with an index, or `model.safetensors` when one suffices."""

    def __init__(self, folder: Path, max_shard_bytes: int):
        self.folder, self.max = folder, max_shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.size = 0
        self.files: list[tuple[str, list[str]]] = []
        self.total = 0

    def add(self, tensors: dict[str, torch.Tensor]) -> None:
        for name, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            if self.pending and self.size + nbytes > self.max:
                self.flush()
            self.pending[name] = t.contiguous()
            self.size += nbytes
            self.total += nbytes

    def flush(self) -> None:
        if not self.pending:
            return
        fname = f"model-{len(self.files) + 1:05d}.safetensors"
        save_file(self.pending, str(self.folder / fname), metadata={"format": "pt"})
        self.files.append((fname, list(self.pending)))
        self.pending, self.size = {}, 0

    def finish(self) -> None:
        self.flush()
        if len(self.files) == 1:
            (self.folder / self.files[0][0]).rename(self.folder / WEIGHTS)
            return
        n, weight_map = len(self.files), {}
        for k, (fname, names) in enumerate(self.files):
            final = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
            (self.folder / fname).rename(self.folder / final)
            weight_map.update({name: final for name in names})
        meta = {"total_size": self.total}  # bytes of tensor data, as transformers counts it
        (self.folder / INDEX).write_text(json.dumps({"metadata": meta, "weight_map": weight_map}, indent=2))


def write_weights(folder: Path, tensors: dict[str, torch.Tensor], max_shard_bytes: int = 2 * 1024**3) -> None:
    """Write safetensors, sharded with an index when larger than `max_shard_bytes`."""
    writer = ShardWriter(folder, max_shard_bytes)
    writer.add(tensors)
    writer.finish()


def copy_side_files(src: Path, dst: Path) -> None:
    """Tokenizer and image-processor files travel with the weights, so outputs can be evaluated."""
    for name in SIDE_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
