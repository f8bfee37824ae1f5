"""Evaluation and training data as batches of stock HF forward kwargs.

`load_batches(model_dir, data, split)` returns a list of dicts, each with the kwargs the stock model
takes plus `labels`:

- language models: `input_ids [B, T]` and `labels [B, T]` equal to `input_ids` — Hugging Face's
  convention: the model shifts internally, so `model(**batch).loss` is the next-token loss, and
  position t's logits are scored against `labels[:, t + 1]`. Each window gives T - 1 predictions.
- image classifiers: `pixel_values [B, C, H, W]` float32 and `labels [B]` class ids.

Text (`*.txt` or any other file): decoded as UTF-8, tokenised by the model folder's OWN tokenizer
(`AutoTokenizer.from_pretrained(model_dir)`), cut into non-overlapping windows of `seq_len` tokens
(default: the model's context length). Windows are split by position: the first 90% train, the next
5% validation, the last 5% test (at least one window each); `split="all"` is every window.
Images: see `symmerge.data.images`. `hf:NAME` loads a dataset with the optional `datasets` package
(`symmerge.data.hf_datasets`).
Everything is deterministic: the same call returns the same batches, in file order.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import SymmergeError
from .hf_datasets import hf_rows, image_arrays, text_of
from .images import SPLITS, is_image_source, load_images, preprocess, read_processor_config
from .tokenizers import encode, load_tokenizer

#: fractions of the windows in (train, validation, test), contiguous in this order
TEXT_SPLIT = (0.90, 0.05, 0.05)


def read_text(path: str | Path) -> str:
    """The text of a corpus file; binary or non-UTF-8 files are refused with a clear error."""
    p = Path(path)
    if not p.is_file():
        raise SymmergeError(f"{p} does not exist; pass a .txt file, a folder of IDX files, mnist.pkl.gz or 'digits'")
    raw = p.read_bytes()
    if b"\x00" in raw[:65536]:
        raise SymmergeError(f"{p} looks binary (NUL bytes); pass a UTF-8 text file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SymmergeError(f"{p} is not UTF-8 text (byte {e.start}: {e.reason}); convert it to UTF-8") from None
    if not text:
        raise SymmergeError(f"{p} is empty")
    return text


#: what `split_range` counts: a text's windows, unless the caller names its items and how to get more
TEXT_ITEMS = ("the text gives only {n} windows", "a longer text, a smaller --seq-len")


def split_range(n: int, split: str, items: tuple[str, str] = TEXT_ITEMS) -> tuple[int, int]:
    """[start, stop) of `split` among n items (windows of a text, rows of a data set): contiguous 90/5/5, each
    part at least one item. `items`: (what n counts, with `{n}`; how to get more), for the too-short message."""
    if split not in SPLITS:
        raise SymmergeError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if split == "all":
        return 0, n
    if n < 3:
        what, more = items
        raise SymmergeError(f"{what.format(n=n)}; it needs at least 3 for train/validation/test (use {more}, or --split all)")
    n_val = max(1, round(n * TEXT_SPLIT[1]))
    n_test = max(1, round(n * TEXT_SPLIT[2]))
    bounds = {"train": (0, n - n_val - n_test), "validation": (n - n_val - n_test, n - n_test), "test": (n - n_test, n)}
    return bounds[split]


def context_length(config) -> int:
    for key in ("n_positions", "max_position_embeddings"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    raise SymmergeError("the model config has no context length (n_positions / max_position_embeddings); pass --seq-len")


def token_windows(tokenizer, text: str, seq_len: int, split: str, source: str = "text") -> torch.Tensor:
    """Non-overlapping windows `[n, seq_len]` (int64) of one split of the tokenised text."""
    return windows_of(torch.tensor(encode(tokenizer, text), dtype=torch.int64), seq_len, split, source)


def windows_of(ids: torch.Tensor, seq_len: int, split: str, source: str = "text") -> torch.Tensor:
    n = len(ids) // seq_len
    if n == 0:
        raise SymmergeError(f"{source} has {len(ids)} tokens, fewer than one window of {seq_len}; use a smaller --seq-len")
    a, b = split_range(n, split)
    return ids[: n * seq_len].reshape(n, seq_len)[a:b]  # (n_split, T)


def _model_config(model_dir: Path):
    from ..store.io import load_config

    return load_config(Path(model_dir))


def is_vision(config) -> bool:
    return getattr(config, "model_type", "") == "vit" or "pixel" in str(getattr(config, "main_input_name", ""))


def load_items(model_dir, data: str, split: str = "test", seq_len: int | None = None) -> dict[str, torch.Tensor]:
    """All items of one split as stacked tensors (the forward kwargs and `labels`)."""
    model_dir = Path(model_dir)
    config = _model_config(model_dir)
    if data.startswith("hf:"):
        return _hf_items(model_dir, config, data[3:], split, seq_len)
    if is_vision(config):
        if not is_image_source(data):
            raise SymmergeError(f"{model_dir} is an image classifier but {data} is not an image data set; "
                                "pass a folder of IDX files, mnist.pkl.gz or 'digits'")
        cfg = read_processor_config(model_dir)
        x, y = load_images(data, split)
        _check_labels(y, config)
        return {"pixel_values": preprocess(x, cfg, int(config.image_size), int(config.num_channels)), "labels": y}
    if is_image_source(data):
        raise SymmergeError(f"{model_dir} is a language model but {data} is an image data set; pass a text file")
    ctx = context_length(config)
    if seq_len is not None and not 2 <= seq_len <= ctx:
        raise SymmergeError(f"--seq-len {seq_len} is outside 2..{ctx} (the model's context length)")
    windows = windows_of(_token_ids(model_dir, data), seq_len or ctx, split, source=data)
    _check_vocab(windows, config, model_dir)
    return {"input_ids": windows.clone(), "labels": windows.clone()}  # copies: the memoised ids stay intact


def _token_ids(model_dir: Path, data: str) -> torch.Tensor:
    """All token ids of a text file under the folder's tokenizer; memoised on both files' identity
    (path, size, mtime), so evaluating several splits tokenises once."""
    if not Path(data).is_file():
        read_text(data)  # raises the user-facing error
    key = tuple((str(Path(p).resolve()), Path(p).stat().st_size, Path(p).stat().st_mtime_ns)
                for p in (data, *[f for f in (model_dir / "tokenizer.json",) if f.is_file()]))
    if key not in _TOKEN_CACHE:
        tok = load_tokenizer(model_dir)
        text = read_text(data)
        _TOKEN_CACHE.clear()  # keep one corpus in memory at most
        _TOKEN_CACHE[key] = torch.tensor(encode(tok, text), dtype=torch.int64)
    return _TOKEN_CACHE[key]


_TOKEN_CACHE: dict[tuple, torch.Tensor] = {}


def _check_labels(y: torch.Tensor, config) -> None:
    n = int(getattr(config, "num_labels", 0) or 0)
    if n and len(y) and int(y.max()) >= n:
        raise SymmergeError(f"labels go up to {int(y.max())} but the model has {n} classes; use the matching data set")


def _check_vocab(windows: torch.Tensor, config, model_dir: Path) -> None:
    v = int(getattr(config, "vocab_size", 0) or 0)
    if v and windows.numel() and int(windows.max()) >= v:
        raise SymmergeError(f"{model_dir}: its tokenizer yields id {int(windows.max())} but the model's vocab_size is {v}; "
                            "the tokenizer files do not belong to this model")


def batched(items: dict[str, torch.Tensor], batch_size: int, max_batches: int | None = None) -> list[dict[str, torch.Tensor]]:
    """Consecutive batches in item order; the last may be smaller."""
    if batch_size < 1:
        raise SymmergeError(f"--batch-size must be positive, got {batch_size}")
    n = len(next(iter(items.values())))
    if n == 0:
        raise SymmergeError("the split is empty; choose another split or more data")
    starts = range(0, n, batch_size)
    if max_batches is not None:
        starts = starts[:max_batches]
    return [{k: v[s: s + batch_size] for k, v in items.items()} for s in starts]


def load_batches(model_dir, data: str, split: str = "test", batch_size: int = 8, seq_len: int | None = None,
                 max_batches: int | None = None) -> list[dict[str, torch.Tensor]]:
    """Deterministic batches of one split of `data`, prepared for the model in `model_dir`."""
    return batched(load_items(model_dir, str(data), split, seq_len), batch_size, max_batches)


def _hf_items(model_dir: Path, config, name: str, split: str, seq_len: int | None) -> dict[str, torch.Tensor]:
    """`load_items` of `hf:NAME` (`hf_datasets.py`): a single data set split as a file of its kind is."""
    rows, single = hf_rows(name, split)
    if is_vision(config):
        if single:
            rows = rows.select(range(*split_range(len(rows), split, (f"{name} has only {{n}} images", "more images"))))
        x, y = image_arrays(rows, name)
        cfg = read_processor_config(model_dir)
        return {"pixel_values": preprocess(x, cfg, int(config.image_size), int(config.num_channels)), "labels": y}
    windows = token_windows(load_tokenizer(model_dir), text_of(rows, name), seq_len or context_length(config),
                            split if single else "all", source=name)
    return {"input_ids": windows, "labels": windows.clone()}
