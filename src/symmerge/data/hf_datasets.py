"""`--data hf:NAME`: a data set through the optional `datasets` package: a folder written by `save_to_disk`, a
folder of data files (`datasets.load_dataset` of the folder: an image folder with one folder per class, text,
CSV, JSON, Parquet) or a Hub name (cached locally).

Text data sets need a `text` column (rows joined with newlines, then cut into windows); image data sets an
`image` or `img` column and a `label` column. The split asked for is taken so that train, validation and test
never share an item:

- a `DatasetDict` gives its own split (its validation split may be named `validation`, `valid`, `val` or
  `dev`); one without a validation split but with a train split gives as
  validation the last `VAL_SHARE` of train's rows, and as train the rows before them (as MNIST's IDX files
  are split, 5,000 of 60,000); `all` is every split, concatenated;
- a single `Dataset` is split as a text file is (`batches.split_range`, by the caller): text by windows of its
  joined rows, images by rows, contiguous 90/5/5.

A split the data set does not have (a test split of a dictionary without one) is refused, naming the splits
it has.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch

from ..errors import SymmergeError

#: the files `save_to_disk` writes at a data set's top (a dictionary of splits, or one split)
SAVED = ("dataset_dict.json", "state.json")
#: the channel counts of grey, colour and colour-with-alpha images
CHANNELS = (1, 3, 4)
#: PIL modes whose arrays are not pixel values (a palette's indices, an alpha channel, ...), and what they become:
#: grey or colour, as stock image processors convert them
CONVERT = {"1": "L", "LA": "L", "P": "RGB", "PA": "RGB", "RGBA": "RGB", "CMYK": "RGB", "YCbCr": "RGB", "HSV": "RGB"}
#: the names data sets give a split, in the order they are looked for
NAMES = {"validation": ("validation", "valid", "val", "dev")}
#: the share of a train split's rows a data set without a validation split gives as validation
VAL_SHARE = 1 / 12


def hf_rows(name: str, split: str):
    """(rows, single): the rows of `split` of data set `name`, or, for a single Dataset (`single`), all its rows,
    which the caller splits as it splits a file of its kind."""
    datasets = _datasets()
    ds = _load(datasets, name, split)
    if not isinstance(ds, datasets.DatasetDict):
        return ds, True
    return pick(datasets, ds, split, name), False


def image_arrays(rows, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw images float32, `[N, H, W]` (grey) or `[N, C, H, W]`, and labels `[N]` int64 from an `image` (or
    `img`) and a `label` column. Colour images come channels last, as PIL gives them (`[H, W, C]`, C of 1, 3 or
    4), and are turned channels first; an array of another layout is taken as it is."""
    col = "image" if "image" in rows.column_names else "img"
    missing = [c for c in (col, "label") if c not in rows.column_names]
    if missing:
        raise SymmergeError(f"dataset {name} has no {' or '.join(missing)} column (columns: {rows.column_names})")
    arrays = [np.asarray(_pixels(im), dtype=np.float32) for im in rows[col]]
    shapes = sorted({a.shape for a in arrays})
    if len(shapes) > 1:
        raise SymmergeError(f"dataset {name}'s images differ in size ({shapes[0]}, {shapes[-1]}, ...); give images of "
                            "one size")
    x = torch.as_tensor(np.stack(arrays))
    if x.ndim == 4 and x.shape[-1] in CHANNELS and x.shape[1] not in CHANNELS:
        x = x.permute(0, 3, 1, 2)
    return x, torch.as_tensor(rows["label"], dtype=torch.int64)


def _pixels(image):
    """A PIL image in a mode whose array holds its pixel values (`CONVERT`); anything else as it is."""
    mode = getattr(image, "mode", None)
    return image.convert(CONVERT[mode]) if mode in CONVERT else image


def text_of(rows, name: str) -> str:
    """The `text` column's rows joined with newlines."""
    if "text" not in rows.column_names:
        raise SymmergeError(f"dataset {name} has no 'text' column (columns: {rows.column_names})")
    return "\n".join(rows["text"])


def pick(datasets, ds, split: str, name: str):
    """Split `split` of DatasetDict `ds`: its own (a validation split under any name of `NAMES`), or validation
    cut from the end of train where it has none (train then the rows before it), or every split for `all`."""
    if split == "all":
        return datasets.concatenate_datasets([ds[k] for k in ds])
    split = next((k for k in NAMES.get(split, ()) if k in ds), split)
    cut = not any(k in ds for k in NAMES["validation"]) and "train" in ds
    if cut and split in ("train", "validation"):
        n = len(ds["train"])
        n_val = max(1, round(n * VAL_SHARE))
        if n - n_val < 1:
            raise SymmergeError(f"dataset {name}'s train split has {n} rows: too few to give a validation split too")
        return ds["train"].select(range(n - n_val) if split == "train" else range(n - n_val, n))
    if split not in ds:
        raise SymmergeError(f"dataset {name} has no {split} split (it has {', '.join(ds)}); pass --split with one "
                            "of them, or a data set that has it")
    return ds[split]


def _datasets():
    try:
        import datasets
    except ImportError:
        raise SymmergeError("hf:NAME needs the optional 'datasets' package: pip install 'symmerge[datasets]'") from None
    return datasets


def _load(datasets, name: str, split: str):
    """The data set `name`: a folder written by `save_to_disk`, a folder of data files `datasets` reads (images in
    one folder per class, under a folder per split or not; text, CSV, JSON or Parquet files), or a Hub name
    (refused at once when offline and not cached)."""
    try:
        if Path(name).is_dir():
            saved = any((Path(name) / f).is_file() for f in SAVED)
            return datasets.load_from_disk(name) if saved else datasets.load_dataset(name)
        with _hub_offline_unless_reachable(datasets) as why:
            try:
                return datasets.load_dataset(name)
            except (ConnectionError, FileNotFoundError) as e:
                if why is None:
                    raise
                raise SymmergeError(f"dataset {name} is not in the local cache and {why}: run once with network "
                                    "access to cache it, or pass hf:FOLDER (a folder written by "
                                    "Dataset.save_to_disk)") from e
    except SymmergeError:
        raise
    except (KeyError, FileNotFoundError, ValueError, OSError) as e:
        raise SymmergeError(f"cannot load dataset {name} split {split}: {str(e).splitlines()[0]}") from None


@contextlib.contextmanager
def _hub_offline_unless_reachable(datasets):
    """Yields None when the Hub can be asked (`hub.offline_reason`, HF_DATASETS_OFFLINE counted too), else
    why not; while it cannot, `datasets` and `huggingface_hub` run offline (cached datasets still load),
    so that an unknown name fails at once rather than after a minute of retries."""
    import huggingface_hub.constants as constants

    from ..store.hub import offline_reason

    why = offline_reason(("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    if why is None:
        yield None
        return
    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield why
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved
