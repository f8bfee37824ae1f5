"""The inputs of the bad-input catalogue (`test_bad_input.py`) and the kill tests (`test_kill.py`).

`build(root)` writes, once per module, everything a case may read: small char GPT-2s (two of one kind,
one with another tokenizer, one with a smaller vocabulary, one wider, one deeper), a ViT, a Llama, a
BERT, checkpoints broken in the ways a copy or a hand edit breaks them (truncated, header cut, index
lying about or missing its shards, no config, no weights, pickles only, a tensor missing or of the
wrong shape), and data files that are empty, binary, not UTF-8, too short, or IDX files cut short.
Every case's argv is built from these paths; none of them may change (the test compares digests).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch
import transformers as T
from safetensors.torch import load_file, save_file

from symmerge.data.images import processor_config, write_processor_config
from symmerge.data.tokenizers import char_tokenizer

TEXT = "".join(chr(c) for c in range(32, 127)) * 40 + "\n"  # every printable ASCII character
WEIGHTS = "model.safetensors"


def lm(path: Path, seed: int, text: str = TEXT, n_layer: int = 2, width: int = 24) -> Path:
    """A random-initialised char-level GPT-2 with its tokenizer."""
    tok = char_tokenizer(text)
    torch.manual_seed(seed)
    model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=width, n_layer=n_layer, n_head=3, n_positions=32, vocab_size=len(tok)))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _vit(path: Path) -> Path:
    torch.manual_seed(0)
    model = T.ViTForImageClassification(T.ViTConfig(hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                                                    intermediate_size=40, image_size=8, patch_size=4, num_channels=1,
                                                    num_labels=10))
    model.save_pretrained(path)
    write_processor_config(path, processor_config(8, 1, 0.3, 0.4))
    return path


def _save(model, path: Path) -> Path:
    torch.manual_seed(0)
    model.save_pretrained(path)
    return path


def _idx(path: Path, dims: tuple[int, ...], payload: bytes) -> None:
    header = bytes([0, 0, 8, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims)
    path.write_bytes(header + payload)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _broken_checkpoints(c: dict, root: Path) -> None:
    a = c["a"]
    sd = load_file(str(a / WEIGHTS))
    names = sorted(sd)
    half = len(names) // 2
    shard = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")

    def sharded(name: str, drop_last: bool, index_text: str | None = None, write_second: bool = True) -> Path:
        folder = root / name
        folder.mkdir()
        save_file({k: sd[k] for k in names[:half]}, str(folder / shard[0]), metadata={"format": "pt"})
        if write_second:
            rest = names[half:-1] if drop_last else names[half:]
            save_file({k: sd[k] for k in rest}, str(folder / shard[1]), metadata={"format": "pt"})
        weight_map = {k: shard[0] if i < half else shard[1] for i, k in enumerate(names)}
        text = json.dumps({"metadata": {}, "weight_map": weight_map}) if index_text is None else index_text
        (folder / "model.safetensors.index.json").write_text(text)
        for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            if (a / f).is_file():
                (folder / f).write_bytes((a / f).read_bytes())
        return folder

    c["lying_index"] = sharded("lying_index", drop_last=True)  # the index names a tensor its shard lacks
    c["missing_shard"] = sharded("missing_shard", drop_last=False, write_second=False)
    c["bad_index"] = sharded("bad_index", drop_last=False, index_text="{not json")
    raw = (a / WEIGHTS).read_bytes()
    c["truncated"] = _copy(a, root / "truncated")
    (c["truncated"] / WEIGHTS).write_bytes(raw[: len(raw) // 2])  # a copy cut short
    c["header_cut"] = _copy(a, root / "header_cut")
    (c["header_cut"] / WEIGHTS).write_bytes(raw[:6])  # cut inside the 8-byte header length
    c["missing_tensor"] = _copy(a, root / "missing_tensor")
    save_file({k: v for k, v in sd.items() if k != "transformer.h.1.mlp.c_fc.weight"},
              str(c["missing_tensor"] / WEIGHTS), metadata={"format": "pt"})
    c["wrong_shape"] = _copy(a, root / "wrong_shape")
    save_file({**sd, "transformer.h.1.mlp.c_fc.weight": sd["transformer.h.1.mlp.c_fc.weight"][:, :-1].contiguous()},
              str(c["wrong_shape"] / WEIGHTS), metadata={"format": "pt"})
    c["no_config"] = root / "no_config"
    c["no_config"].mkdir()
    (c["no_config"] / WEIGHTS).write_bytes(raw)
    c["no_weights"] = root / "no_weights"
    c["no_weights"].mkdir()
    (c["no_weights"] / "config.json").write_bytes((a / "config.json").read_bytes())
    c["pickles"] = root / "pickles"
    c["pickles"].mkdir()
    (c["pickles"] / "config.json").write_bytes((a / "config.json").read_bytes())
    (c["pickles"] / "pytorch_model.bin").write_bytes(b"never unpickled")
    for name, text in (("bad_config", "{not json"), ("typeless_config", "{}")):
        c[name] = root / name
        c[name].mkdir()
        (c[name] / "config.json").write_text(text)
        (c[name] / WEIGHTS).write_bytes(raw)
    c["no_tokenizer"] = root / "no_tokenizer"
    c["no_tokenizer"].mkdir()
    for f in ("config.json", WEIGHTS):
        (c["no_tokenizer"] / f).write_bytes((a / f).read_bytes())


def _data_files(c: dict, root: Path) -> None:
    for name, content in (("text", (TEXT * 3).encode()), ("unseen", (TEXT * 3 + "αβγ").encode()), ("empty", b""),
                          ("binary", b"\x00\x01\x02" * 100), ("latin1", "caf\xe9 ".encode("latin-1") * 200),
                          ("short", TEXT[:40].encode())):
        c[name] = root / f"{name}.txt"
        c[name].write_bytes(content)
    c["file"] = root / "a_file"
    c["file"].write_text("not a folder")
    # IDX folders: truncated pixel data; a header cut inside the dimensions; a bad magic number;
    # images of another size than the ViT's; labels beyond its classes
    for name, dims, payload, labels in (("idx_trunc", (20, 8, 8), bytes(100), bytes(20)),
                                        ("idx_header", (20, 8, 8), b"", bytes(20)),
                                        ("idx_magic", (20, 8, 8), bytes(20 * 64), bytes(20)),
                                        ("idx_size", (20, 6, 6), bytes(20 * 36), bytes(20)),
                                        ("idx_labels", (20, 8, 8), bytes(20 * 64), bytes([11] * 20))):
        folder = root / name
        folder.mkdir()
        for prefix in ("train", "t10k"):
            _idx(folder / f"{prefix}-labels-idx1-ubyte", (20,), labels)
            images = folder / f"{prefix}-images-idx3-ubyte"
            _idx(images, dims, payload)
            if name == "idx_header":  # the images' header stops after the magic number and one dimension
                images.write_bytes(images.read_bytes()[:8])
            if name == "idx_magic":
                images.write_bytes(b"\x01\x02" + images.read_bytes()[2:])
        c[name] = folder
    c["idx_no_test"] = _copy(c["idx_trunc"], root / "idx_no_test")
    for f in c["idx_no_test"].glob("t10k-*"):
        f.unlink()


#: commits of the hub cache `hub_cache` lays out (40 hex digits, as the Hub's)
COMMITS = {"a": "a" * 40, "b": "b" * 40, "pickles": "c" * 40, "wide": "d" * 40}


def hub_cache(root: Path, a: Path, b: Path, wide: Path | None = None) -> Path:
    """A Hugging Face Hub cache at `root/hub`, laid out as huggingface_hub writes it (`models--ORG--NAME/refs/<ref>`
    holding a commit, `snapshots/<commit>/` the files): `org/pair` at main is `a`, at tag v1 `b`; `org/pickles`
    holds pickled weights only (never unpickled: not a real pickle); `org/wide` is `wide` where given. Use it with
    huggingface_hub.constants.HF_HUB_CACHE (or the HF_HUB_CACHE variable of a fresh process) pointing there, and
    HF_HUB_OFFLINE=1."""
    cache = root / "hub"

    def repo(name: str, refs: dict[str, str], snapshots: dict[str, Path]) -> Path:
        storage = cache / f"models--org--{name}"
        (storage / "refs").mkdir(parents=True)
        for ref, commit in refs.items():
            (storage / "refs" / ref).write_text(commit)
        for commit, src in snapshots.items():
            shutil.copytree(src, storage / "snapshots" / commit)
        return storage

    repo("pair", {"main": COMMITS["a"], "v1": COMMITS["b"]}, {COMMITS["a"]: a, COMMITS["b"]: b})
    pickles = repo("pickles", {"main": COMMITS["pickles"]}, {}) / "snapshots" / COMMITS["pickles"]
    pickles.mkdir(parents=True)
    shutil.copy(a / "config.json", pickles / "config.json")
    (pickles / "pytorch_model.bin").write_bytes(b"never unpickled")
    if wide is not None:
        repo("wide", {"main": COMMITS["wide"]}, {COMMITS["wide"]: wide})
    return cache


def build(root: Path) -> dict:
    """Every input of the catalogue under `root`; keys name them (see the module docstring)."""
    c = {"root": root, "a": lm(root / "a", 0), "b": lm(root / "b", 1), "vit": _vit(root / "vit")}
    c["other_tok"] = lm(root / "other_tok", 2, text=TEXT.replace("~", "é"))  # same size, other characters
    c["c"] = lm(root / "c", 3)  # a third model of A's kind (merge, barrier of n models)
    c["small_vocab"] = lm(root / "small_vocab", 4, text=TEXT.replace("~", ""))  # one character fewer
    c["wide"] = lm(root / "wide", 5, width=48)  # A's kind, twice the width (expand)
    c["deep"] = lm(root / "deep", 6, n_layer=3)  # A's kind, one block more
    c["llama"] = _save(T.LlamaForCausalLM(T.LlamaConfig(hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                                                        num_attention_heads=3, num_key_value_heads=3,
                                                        vocab_size=len(char_tokenizer(TEXT)),
                                                        max_position_embeddings=32)), root / "llama")
    c["bert"] = _save(T.BertForMaskedLM(T.BertConfig(hidden_size=24, num_hidden_layers=1, num_attention_heads=3,
                                                     intermediate_size=40, vocab_size=100,
                                                     max_position_embeddings=32)), root / "bert")
    _broken_checkpoints(c, root)
    _data_files(c, root)
    c["hub"] = hub_cache(root, c["a"], c["b"])
    return c


#: the inputs whose bytes every case must leave as they were (every folder `build` writes)
def folders(c: dict) -> list[str]:
    return [k for k, v in c.items() if k != "root" and isinstance(v, Path) and v.is_dir()]


def digest(path: Path) -> dict:
    """sha256 of every file under `path` (or of `path` itself)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def leftovers(out: Path) -> list[Path]:
    """Temporary or hidden old folders of writes into `out`."""
    return list(out.parent.glob(f".{out.name}.tmp-*")) + list(out.parent.glob(f".{out.name}.old-*"))
