"""Image data sets and the model folder's image preprocessing.

Sources (all return raw images as float32 `[N, H, W]` in 0..255 pixel units, and int64 labels):

- a folder of MNIST-format IDX files (`train-images-idx3-ubyte[.gz]`, `train-labels-idx1-ubyte[.gz]`,
  `t10k-*`): `train` = the train file minus its last 1/12 (`validation`, 5,000 of 60,000), `test` = t10k;
- `mnist.pkl.gz`: the classic (train 50k, validation 10k, test 10k) pickle. This is the ONE pickle
  symmerge reads, and only when the user names the file: it is a data set, not weights, and is
  loaded with `pickle.load(..., encoding="latin1")` (pixels stored as k/256, turned back into k);
- `digits`: scikit-learn's `load_digits` (1,797 8x8 images, values 0..16, scaled by 255/16), split
  contiguously 80/10/10 into train/validation/test.

`split="all"` concatenates train, validation and test.

Preprocessing follows the model folder's `preprocessor_config.json` (ViTImageProcessor fields):
resize to `size` (bilinear, antialiased, in torch), rescale by `rescale_factor`, normalise with
`image_mean`/`image_std`, and repeat grey channels to the model's `num_channels`. Without a resize it
equals `ViTImageProcessor` exactly (tested); with a resize it differs from PIL's bilinear by
interpolation details. If the images do not have the model's size and the config says
`do_resize: false`, loading fails with a SymmergeError (no silent crop or pad).
"""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from ..errors import SymmergeError

SPLITS = ("train", "validation", "test", "all")
PREPROCESSOR = "preprocessor_config.json"


def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST format): magic 0x00 0x00 dtype ndim, big-endian dims, then raw data."""
    try:
        with _open(path) as f:
            head = f.read(4)
            if len(head) != 4 or head[0] != 0 or head[1] != 0 or head[2] != 0x08:
                raise SymmergeError(f"{path} is not an unsigned-byte IDX file (bad magic number); pass MNIST-format files")
            raw_dims = f.read(4 * head[3])
            if len(raw_dims) != 4 * head[3]:
                raise SymmergeError(f"{path}: the header is cut short ({len(raw_dims)} of {4 * head[3]} bytes of "
                                    "dimensions); the file is truncated: re-copy it")
            dims = struct.unpack(">" + "I" * head[3], raw_dims)
            data = np.frombuffer(f.read(), dtype=np.uint8)
    except (EOFError, OSError, zlib.error) as e:  # a cut or corrupt .gz stream
        raise SymmergeError(f"cannot read {path}: {e}; the file is truncated or corrupt: re-copy it") from None
    if data.size != int(np.prod(dims)):
        raise SymmergeError(f"{path} holds {data.size} bytes but its header says {dims}; the file is truncated")
    return data.reshape(dims)


def _idx_file(folder: Path, prefix: str, kind: str) -> Path:
    hits = sorted(p for p in folder.iterdir() if p.name.startswith(f"{prefix}-{kind}"))
    if not hits:
        raise SymmergeError(f"{folder} has no {prefix}-{kind}-idx*-ubyte[.gz] file; pass a folder of MNIST-format IDX files")
    return hits[0]


def _idx_pair(folder: Path, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = read_idx(_idx_file(folder, prefix, "images")), read_idx(_idx_file(folder, prefix, "labels"))
    if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
        raise SymmergeError(f"{folder}: {prefix} images {x.shape} and labels {y.shape} do not match")
    return x, y


def _cut(parts: dict[str, tuple], split: str) -> tuple[np.ndarray, np.ndarray]:
    if split == "all":
        return (np.concatenate([parts[s][0] for s in SPLITS[:3]]), np.concatenate([parts[s][1] for s in SPLITS[:3]]))
    return parts[split]


def idx_folder(folder: Path, split: str):
    if split == "test":
        return _idx_pair(folder, "t10k")
    x, y = _idx_pair(folder, "train")
    n_val = len(x) // 12
    parts = {"train": (x[: len(x) - n_val], y[: len(y) - n_val]), "validation": (x[len(x) - n_val:], y[len(y) - n_val:])}
    if split == "all":
        parts["test"] = _idx_pair(folder, "t10k")
    return _cut(parts, split)


def mnist_pickle(path: Path, split: str):
    """The classic mnist.pkl.gz. The only pickle symmerge loads: a data set the user pointed at."""
    import pickle

    try:
        with gzip.open(path, "rb") as f:
            train, val, test = pickle.load(f, encoding="latin1")
    except (OSError, ValueError, pickle.UnpicklingError, EOFError) as e:
        raise SymmergeError(f"cannot read {path} as the classic mnist.pkl.gz ({e})") from None
    side = int(round(np.sqrt(train[0].shape[1])))

    def raw(part):  # pixels are k/256 in float32; back to k in 0..255
        return np.rint(np.asarray(part[0]) * 256).reshape(-1, side, side), np.asarray(part[1])

    return _cut({"train": raw(train), "validation": raw(val), "test": raw(test)}, split)


def digits(split: str):
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = d.images * (255.0 / 16.0), d.target
    n = len(x)
    a, b = int(n * 0.8), int(n * 0.9)
    return _cut({"train": (x[:a], y[:a]), "validation": (x[a:b], y[a:b]), "test": (x[b:], y[b:])}, split)


def is_image_source(data: str) -> bool:
    p = Path(data)
    return data == "digits" or p.is_dir() or p.name.endswith(".pkl.gz")


def load_images(data: str, split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
    """Raw images `[N, H, W]` float32 (0..255) and labels `[N]` int64 of one split."""
    if split not in SPLITS:
        raise SymmergeError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    p = Path(data)
    if data == "digits":
        x, y = digits(split)
    elif p.is_dir():
        x, y = idx_folder(p, split)
    elif p.name.endswith(".pkl.gz") and p.is_file():
        x, y = mnist_pickle(p, split)
    else:
        raise SymmergeError(f"{data} is not an image data set; pass a folder of IDX files, mnist.pkl.gz or 'digits'")
    return torch.as_tensor(np.asarray(x, dtype=np.float32)), torch.as_tensor(np.asarray(y, dtype=np.int64))


def processor_config(image_size: int, num_channels: int = 1, mean: float = 0.5, std: float = 0.5) -> dict:
    """A ViTImageProcessor config: resize to the model's size, scale to [0, 1], normalise."""
    return {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True, "size": {"height": image_size, "width": image_size}, "resample": 2,
        "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": [mean] * num_channels, "image_std": [std] * num_channels,
    }


def write_processor_config(folder: Path, cfg: dict) -> None:
    (Path(folder) / PREPROCESSOR).write_text(json.dumps(cfg, indent=2) + "\n")


def read_processor_config(folder: Path) -> dict:
    path = Path(folder) / PREPROCESSOR
    if not path.is_file():
        raise SymmergeError(f"{folder} has no {PREPROCESSOR}; write one (symmerge train does) so images can be preprocessed")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SymmergeError(f"{path} is not valid JSON ({e})") from None


def preprocess(images: torch.Tensor, cfg: dict, image_size: int, num_channels: int) -> torch.Tensor:
    """Raw `[N, H, W]` (or `[N, C, H, W]`) 0..255 images -> `pixel_values [N, C, size, size]` float32."""
    x = images.to(torch.float32)
    x = x[:, None] if x.ndim == 3 else x  # (N, C, H, W)
    size = cfg.get("size", {"height": image_size, "width": image_size})
    hw = (int(size.get("height", size.get("shortest_edge", image_size))), int(size.get("width", size.get("shortest_edge", image_size))))
    if cfg.get("do_resize", True) and tuple(x.shape[-2:]) != hw:
        x = torch.nn.functional.interpolate(x, size=hw, mode="bilinear", antialias=True, align_corners=False)
    if tuple(x.shape[-2:]) != (image_size, image_size):
        raise SymmergeError(f"images are {tuple(x.shape[-2:])} but the model expects {image_size}x{image_size} and its "
                            f"{PREPROCESSOR} does not resize to that; set do_resize and size, or use matching data")
    if cfg.get("do_rescale", True):
        x = x * float(cfg.get("rescale_factor", 1 / 255))
    if x.shape[1] == 1 and num_channels != 1:
        x = x.expand(-1, num_channels, -1, -1)
    if x.shape[1] != num_channels:
        raise SymmergeError(f"images have {x.shape[1]} channels but the model expects {num_channels}")
    if cfg.get("do_normalize", True):
        mean = torch.tensor(cfg.get("image_mean", [0.5] * num_channels), dtype=torch.float32).reshape(1, -1, 1, 1)
        std = torch.tensor(cfg.get("image_std", [0.5] * num_channels), dtype=torch.float32).reshape(1, -1, 1, 1)
        x = (x - mean) / std
    return x.contiguous()
