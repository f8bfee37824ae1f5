"""Data loading, tokenizers, image preprocessing and evaluation, checked against stock HF code."""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers as T

from conftest import shared_data
from symmerge import SymmergeError
from symmerge.cli import main
from symmerge.data.batches import load_batches, split_range
from symmerge.data.images import load_images, preprocess, processor_config, read_processor_config, write_processor_config
from symmerge.data.tokenizers import bpe_tokenizer, char_tokenizer, gpt2_tokenizer
from symmerge.evaluation.forward import evaluate, evaluate_params


@pytest.fixture(scope="module")
def text() -> str:
    return shared_data("tinyshakespeare.txt").read_text()[:20000]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory, text) -> Path:
    p = tmp_path_factory.mktemp("text") / "shakespeare20k.txt"
    p.write_text(text)
    return p


def lm_folder(path: Path, text: str, seed: int = 0, context: int = 32) -> Path:
    """A random tiny stock GPT-2 with a char tokenizer, saved like symmerge train saves it."""
    tok = char_tokenizer(text)
    torch.manual_seed(seed)
    model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=24, n_layer=2, n_head=3, n_positions=context, vocab_size=len(tok)))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def vit_folder(path: Path, image_size: int = 8, seed: int = 0, resize: bool = True, channels: int = 1) -> Path:
    torch.manual_seed(seed)
    model = T.ViTForImageClassification(T.ViTConfig(hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                                                    intermediate_size=40, image_size=image_size, patch_size=4,
                                                    num_channels=channels, num_labels=10))
    model.save_pretrained(path)
    cfg = processor_config(image_size, channels, 0.3, 0.4)
    cfg["do_resize"] = resize
    write_processor_config(path, cfg)
    return path


# ---------------------------------------------------------------- tokenizers

def test_char_tokenizer_round_trip_via_autotokenizer(tmp_path, text):
    char_tokenizer(text).save_pretrained(tmp_path)
    tok = T.AutoTokenizer.from_pretrained(tmp_path)  # stock loader, from tokenizer.json
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character, newlines included
    assert tok.decode(ids) == text
    assert len(tok) == len(set(text)) + 1  # + <unk>
    assert tok.convert_ids_to_tokens(tok("é", add_special_tokens=False)["input_ids"]) == ["<unk>"]  # unseen char


def test_bpe_tokenizer_round_trip_deterministic(tmp_path, text):
    a, b = bpe_tokenizer(text, 300), bpe_tokenizer(text, 300)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()  # same corpus -> same tokenizer
    assert bpe_tokenizer(text, 400).backend_tokenizer.to_str() != a.backend_tokenizer.to_str()  # control
    a.save_pretrained(tmp_path)
    tok = T.AutoTokenizer.from_pretrained(tmp_path)
    probe = text[:500] + " naïve 🤖 text"  # byte-level: unseen characters round-trip too
    ids = tok(probe, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == probe
    assert len(ids) < len(probe.encode())  # merges were learnt
    assert len(tok) <= 300


def test_gpt2_tokenizer_matches_published_encoding(tmp_path, text):
    encoder = shared_data("gpt2-encoder.json", "gpt2-vocab.bpe")
    gpt2_tokenizer(encoder.parent).save_pretrained(tmp_path)
    tok = T.AutoTokenizer.from_pretrained(tmp_path)
    assert len(tok) == 50257
    assert tok("Hello world", add_special_tokens=False)["input_ids"] == [15496, 995]  # GPT-2's published ids
    ref = T.GPT2Tokenizer(vocab=str(encoder), merges=str(encoder.parent / "gpt2-vocab.bpe"))
    ours = tok(text[:3000], add_special_tokens=False)["input_ids"]
    assert ours == ref.encode(text[:3000])  # transformers' own GPT-2 tokenizer built from the same files
    assert tok.decode(ours) == text[:3000]


def test_gpt2_tokenizer_needs_its_files(tmp_path):
    with pytest.raises(SymmergeError, match="encoder.json"):
        gpt2_tokenizer(tmp_path)


# ---------------------------------------------------------------- text splits

def test_text_splits_deterministic_disjoint_and_cover(tmp_path, text, text_file):
    model = lm_folder(tmp_path / "m", text)
    parts = {s: torch.cat([b["input_ids"] for b in load_batches(model, str(text_file), s, 4)]) for s in
             ("train", "validation", "test", "all")}
    n = len(parts["all"])
    assert n == len(text) // 32  # char tokenizer: one token per character, windows of the context length
    assert torch.equal(torch.cat([parts["train"], parts["validation"], parts["test"]]), parts["all"])
    assert [len(parts[s]) for s in ("train", "validation", "test")] == [n - 2 * round(0.05 * n), round(0.05 * n), round(0.05 * n)]
    again = load_batches(model, str(text_file), "test", 4)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(again, load_batches(model, str(text_file), "test", 4)))
    other = load_batches(model, str(text_file), "validation", 4)  # negative control: another split's windows
    assert not torch.equal(again[0]["input_ids"], other[0]["input_ids"])
    batch = load_batches(model, str(text_file), "train", 3, seq_len=16, max_batches=2)
    assert len(batch) == 2 and batch[0]["input_ids"].shape == (3, 16)
    assert torch.equal(batch[0]["labels"], batch[0]["input_ids"])  # HF shift convention
    with pytest.raises(SymmergeError, match="context length"):
        load_batches(model, str(text_file), "test", 4, seq_len=64)
    tok = T.AutoTokenizer.from_pretrained(model)
    assert tok.decode(parts["all"][0].tolist()) == text[:32]  # windows are the text in order


def test_split_range_edges():
    assert split_range(3, "train") == (0, 1) and split_range(3, "test") == (2, 3)
    assert split_range(100, "validation") == (90, 95)
    with pytest.raises(SymmergeError, match="at least 3"):
        split_range(2, "test")
    with pytest.raises(SymmergeError, match="unknown split"):
        split_range(10, "dev")


# ---------------------------------------------------------------- evaluation vs. stock forward

def _hand_lm_loss(model, batches):
    losses, correct, count = [], 0, 0
    with torch.no_grad():
        for b in batches:
            logits = model(input_ids=b["input_ids"]).logits[:, :-1]  # (B, T-1, V) predicts tokens 1..T-1
            target = b["input_ids"][:, 1:]
            losses.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1)))
            correct += int((logits.argmax(-1) == target).sum())
            count += target.numel()
    return torch.stack(losses), correct / count


def test_evaluate_equals_hand_computed_loss(tmp_path, text, text_file):
    path = lm_folder(tmp_path / "m", text)
    model = T.AutoModelForCausalLM.from_pretrained(path).eval()
    batches = load_batches(path, str(text_file), "train", 4, max_batches=5)
    res = evaluate(model, batches)
    hand, acc = _hand_lm_loss(model, batches)
    assert res["loss"] == pytest.approx(float(hand.mean()), abs=1e-5)  # equal batches: mean of means
    assert res["loss_se"] == pytest.approx(float(hand.std() / len(hand) ** 0.5), abs=1e-5)
    assert res["accuracy"] == pytest.approx(acc, abs=1e-12)
    with torch.no_grad():  # and HF's own loss with labels
        hf = torch.stack([model(**b).loss for b in batches]).mean()
    assert res["loss"] == pytest.approx(float(hf), abs=1e-5)
    assert (res["n_batches"], res["n_items"], res["n_scored"]) == (5, 20, 20 * 31)
    other = T.AutoModelForCausalLM.from_pretrained(lm_folder(tmp_path / "o", text, seed=1))
    assert abs(evaluate(other, batches)["loss"] - res["loss"]) > 1e-3  # negative control


def test_evaluate_params_uses_the_given_parameters(tmp_path, text, text_file):
    a = T.AutoModelForCausalLM.from_pretrained(lm_folder(tmp_path / "a", text, seed=0))
    b = T.AutoModelForCausalLM.from_pretrained(lm_folder(tmp_path / "b", text, seed=1))
    batches = load_batches(tmp_path / "a", str(text_file), "test", 4, max_batches=3)
    before = {k: v.clone() for k, v in a.state_dict().items()}
    via_b = evaluate_params(a, dict(b.named_parameters()), batches)
    assert via_b["loss"] == pytest.approx(evaluate(b, batches)["loss"], abs=1e-6)
    assert evaluate_params(a, dict(a.named_parameters()), batches)["loss"] == pytest.approx(evaluate(a, batches)["loss"], abs=1e-6)
    assert abs(via_b["loss"] - evaluate(a, batches)["loss"]) > 1e-3  # control: not a's own weights
    assert all(torch.equal(v, a.state_dict()[k]) for k, v in before.items())  # a untouched


def test_evaluate_vit_equals_hand_loss(tmp_path):
    path = vit_folder(tmp_path / "v")
    model = T.ViTForImageClassification.from_pretrained(path).eval()
    with torch.no_grad():  # a sharper head: an untrained ViT's logits are so flat its loss hardly sees the labels
        model.classifier.weight.mul_(30)
    batches = load_batches(path, "digits", "test", 60)
    res = evaluate(model, batches)
    with torch.no_grad():
        logits = torch.cat([model(pixel_values=b["pixel_values"]).logits for b in batches])
    labels = torch.cat([b["labels"] for b in batches])
    assert res["loss"] == pytest.approx(float(F.cross_entropy(logits, labels)), abs=1e-5)
    assert res["accuracy"] == pytest.approx(float((logits.argmax(-1) == labels).double().mean()), abs=1e-12)
    assert res["n_items"] == len(labels) == 180
    # negative control: the labels shifted by one image (scored against a neighbour's label)
    wrong = labels.roll(1)
    assert abs(res["loss"] - float(F.cross_entropy(logits, wrong))) > 1e-3
    assert abs(res["accuracy"] - float((logits.argmax(-1) == wrong).double().mean())) > 1e-3


# ---------------------------------------------------------------- images

def test_image_splits(tmp_path):
    sizes = {s: len(load_images("digits", s)[1]) for s in ("train", "validation", "test", "all")}
    assert sizes == {"train": 1437, "validation": 180, "test": 180, "all": 1797}
    fashion, mnist = shared_data("fashion-mnist"), shared_data("mnist/mnist.pkl.gz")
    x, y = load_images(str(fashion), "test")
    assert x.shape == (10000, 28, 28) and y.shape == (10000,) and float(x.max()) == 255.0
    assert len(load_images(str(fashion), "train")[1]) == 55000  # 60k minus 5k validation
    for split, n in (("validation", 10000), ("test", 10000)):
        xp, yp = load_images(str(mnist), split)
        assert xp.shape == (n, 28, 28) and set(yp.tolist()) == set(range(10))
        assert torch.equal(xp, xp.round()) and float(xp.max()) == 255.0  # k/256 stored -> k


def test_preprocessing_matches_vit_image_processor():
    x, _ = load_images(str(shared_data("fashion-mnist")), "test")
    for size, tol in ((28, 1e-6), (14, 0.02)):  # with a resize, PIL's uint8 rounding (1/255/std) differs
        cfg = processor_config(size, 1, 0.3, 0.35)
        proc = T.ViTImageProcessor(**{k: v for k, v in cfg.items() if k != "image_processor_type"})
        ref = proc(images=[x[i].numpy().astype(np.uint8)[:, :, None] for i in range(6)], return_tensors="pt",
                   input_data_format="channels_last")["pixel_values"]
        ours = preprocess(x[:6], cfg, size, 1)
        assert ours.shape == ref.shape == (6, 1, size, size)
        assert float((ours - ref).abs().max()) < tol
        wrong = preprocess(x[:6], processor_config(size, 1, 0.35, 0.3), size, 1)  # negative control: mean and std swapped
        assert float((wrong - ref).abs().max()) > 10 * tol
    three = preprocess(x[:2], processor_config(28, 3), 28, 3)
    assert three.shape == (2, 3, 28, 28) and torch.equal(three[:, 0], three[:, 2])


def test_idx_folder_written_here(tmp_path):
    """A hand-written IDX folder (uncompressed train, gzipped test) loads with the right split sizes."""
    rng = np.random.default_rng(0)
    for prefix, n, opener in (("train", 24, open), ("t10k", 6, gzip.open)):
        imgs = rng.integers(0, 256, (n, 8, 8), dtype=np.uint8)
        suffix = ".gz" if opener is gzip.open else ""
        with opener(tmp_path / f"{prefix}-images-idx3-ubyte{suffix}", "wb") as f:
            f.write(bytes([0, 0, 8, 3]) + struct.pack(">III", n, 8, 8) + imgs.tobytes())
        with opener(tmp_path / f"{prefix}-labels-idx1-ubyte{suffix}", "wb") as f:
            f.write(bytes([0, 0, 8, 1]) + struct.pack(">I", n) + (np.arange(n) % 10).astype(np.uint8).tobytes())
    assert [len(load_images(str(tmp_path), s)[1]) for s in ("train", "validation", "test", "all")] == [22, 2, 6, 30]
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(bytes([0, 0, 8, 3]) + struct.pack(">III", 6, 8, 8)))
    with pytest.raises(SymmergeError, match="truncated"):
        load_images(str(tmp_path), "test")


# ---------------------------------------------------------------- bad input

def test_bad_text_inputs(tmp_path, text):
    model = lm_folder(tmp_path / "m", text)
    (tmp_path / "bin.txt").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 50)
    with pytest.raises(SymmergeError, match="binary"):
        load_batches(model, str(tmp_path / "bin.txt"))
    with pytest.raises(SymmergeError, match="not UTF-8"):
        load_batches(model, str(tmp_path / "latin1.txt"))
    with pytest.raises(SymmergeError, match="does not exist"):
        load_batches(model, str(tmp_path / "missing.txt"))
    (model / "tokenizer.json").unlink()
    (model / "tokenizer_config.json").unlink()
    (tmp_path / "ok.txt").write_text(text)
    with pytest.raises(SymmergeError, match="no tokenizer"):
        load_batches(model, str(tmp_path / "ok.txt"))
    with pytest.raises(SymmergeError, match="image data set"):
        load_batches(model, "digits")


def test_bad_image_inputs(tmp_path):
    fixed = vit_folder(tmp_path / "fixed", image_size=12, resize=False)
    with pytest.raises(SymmergeError, match=r"expects 12x12"):
        load_batches(fixed, "digits")  # 8x8 images, no resize allowed: refused, not cropped
    resized = vit_folder(tmp_path / "resized", image_size=12, resize=True)
    assert load_batches(resized, "digits", max_batches=1)[0]["pixel_values"].shape == (8, 1, 12, 12)
    (resized / "preprocessor_config.json").unlink()
    with pytest.raises(SymmergeError, match="preprocessor_config.json"):
        load_batches(resized, "digits")


def test_hf_datasets_optional(tmp_path, text):
    """hf:NAME works through `datasets` when installed; otherwise the error says how to install it."""
    model = lm_folder(tmp_path / "m", text)
    try:
        import datasets
    except ImportError:
        with pytest.raises(SymmergeError, match=r"pip install 'symmerge\[datasets\]'"):
            load_batches(model, "hf:whatever")
        return
    datasets.DatasetDict({"test": datasets.Dataset.from_dict({"text": text.split("\n")})}).save_to_disk(tmp_path / "ds")
    batches = load_batches(model, f"hf:{tmp_path / 'ds'}", "test", 4)
    assert batches[0]["input_ids"].shape == (4, 32)
    # the same text from a file, taken whole, gives the same windows
    (tmp_path / "joined.txt").write_text("\n".join(text.split("\n")))
    same = load_batches(model, str(tmp_path / "joined.txt"), "all", 4)
    assert _same_windows(batches, same)


def _same_windows(got: list[dict], same: list[dict]) -> bool:
    """Two lists of text batches hold the same windows, batch by batch."""
    return all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(got, same, strict=True))


def _pil_test_split(datasets, images: list, path: Path) -> None:
    """A DatasetDict with one test split of PIL `images` (labels 1, 2, ...) saved to `path`."""
    features = datasets.Features({"img": datasets.Image(), "label": datasets.Value("int64")})
    rows = {"img": images, "label": list(range(1, len(images) + 1))}
    datasets.DatasetDict({"test": datasets.Dataset.from_dict(rows, features=features)}).save_to_disk(path)


def test_hf_splits_never_share_an_item(tmp_path, text, monkeypatch):
    """hf:NAME as a file is split: a single Dataset like a text file (by windows) or an image set (by rows); a
    DatasetDict without a validation split gives the last twelfth of train's rows as validation and the rest as
    train; `all` concatenates; a split it lacks is refused, naming the ones it has."""
    datasets = pytest.importorskip("datasets")
    from symmerge.data.hf_datasets import VAL_SHARE

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # what a folder of files builds

    model = lm_folder(tmp_path / "m", text)
    lines = text.split("\n")
    datasets.Dataset.from_dict({"text": lines}).save_to_disk(tmp_path / "one")
    (tmp_path / "one.txt").write_text("\n".join(lines))
    for split in ("train", "validation", "test", "all"):
        got = load_batches(model, f"hf:{tmp_path / 'one'}", split, 4)
        same = load_batches(model, str(tmp_path / "one.txt"), split, 4)
        assert _same_windows(got, same), split
    train, test = lines[: len(lines) * 3 // 4], lines[len(lines) * 3 // 4:]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": train}),
                          "test": datasets.Dataset.from_dict({"text": test})}).save_to_disk(tmp_path / "two")
    n_val = round(len(train) * VAL_SHARE)
    for split, rows in (("train", train[:-n_val]), ("validation", train[-n_val:]), ("test", test),
                        ("all", train + test)):
        (tmp_path / f"{split}.txt").write_text("\n".join(rows))
        got = load_batches(model, f"hf:{tmp_path / 'two'}", split, 4)
        same = load_batches(model, str(tmp_path / f"{split}.txt"), "all", 4)
        assert _same_windows(got, same), split
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": train}), "dev": datasets.Dataset.from_dict({"text": test}),
                          }).save_to_disk(tmp_path / "dev")  # a validation split by another name is the validation
    for split, rows in (("train", train), ("validation", test)):
        got = load_batches(model, f"hf:{tmp_path / 'dev'}", split, 4)
        (tmp_path / "rows.txt").write_text("\n".join(rows))
        same = load_batches(model, str(tmp_path / "rows.txt"), "all", 4)
        assert _same_windows(got, same), split
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": train})}).save_to_disk(tmp_path / "train-only")
    with pytest.raises(SymmergeError, match="has no test split \\(it has train\\)"):
        load_batches(model, f"hf:{tmp_path / 'train-only'}", "test", 4)
    # images: rows split as the IDX files are, each row's pixels the ones given
    vit = vit_folder(tmp_path / "vit", resize=False)
    rng = np.random.default_rng(0)
    imgs, labels = rng.integers(0, 256, (36, 8, 8)).astype(np.uint8), (np.arange(36) % 10).tolist()
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"image": list(imgs[:24]), "label": labels[:24]}),
                          "test": datasets.Dataset.from_dict({"image": list(imgs[24:]), "label": labels[24:]})}
                         ).save_to_disk(tmp_path / "img")
    cfg = read_processor_config(vit)
    for split, rows in (("train", slice(0, 22)), ("validation", slice(22, 24)), ("test", slice(24, 36))):
        (batch,) = load_batches(vit, f"hf:{tmp_path / 'img'}", split, 64)
        assert torch.equal(batch["labels"], torch.tensor(labels[rows])), split
        assert torch.equal(batch["pixel_values"], preprocess(torch.as_tensor(imgs[rows], dtype=torch.float32), cfg, 8, 1))
    # colour images as PIL gives them (channels last), through the model's preprocessing as stock ViT's processor
    from PIL import Image

    rgb = vit_folder(tmp_path / "rgb", resize=False, channels=3)
    colour = rng.integers(0, 256, (5, 8, 8, 3)).astype(np.uint8)
    _pil_test_split(datasets, [Image.fromarray(c) for c in colour], tmp_path / "rgb-ds")
    proc = T.ViTImageProcessor(**{k: v for k, v in read_processor_config(rgb).items() if k != "image_processor_type"})
    ref = proc(images=list(colour), return_tensors="pt", input_data_format="channels_last")["pixel_values"]
    (batch,) = load_batches(rgb, f"hf:{tmp_path / 'rgb-ds'}", "test", 64)
    assert batch["pixel_values"].shape == ref.shape == (5, 3, 8, 8)
    assert float((batch["pixel_values"] - ref).abs().max()) < 1e-6
    assert float((batch["pixel_values"] - ref.transpose(-1, -2)).abs().max()) > 0.1  # negative control: H and W swapped
    # the same images as palette (P) and RGBA images: their pixels, not the palette's indices or the alpha
    for mode in ("P", "RGBA"):
        stored = [Image.fromarray(c).convert(mode) for c in colour]
        _pil_test_split(datasets, stored, tmp_path / f"rgb-{mode}")
        (got,) = load_batches(rgb, f"hf:{tmp_path / f'rgb-{mode}'}", "test", 64)
        want = proc(images=[np.asarray(im.convert("RGB")) for im in stored], return_tensors="pt",
                    input_data_format="channels_last")["pixel_values"]
        assert float((got["pixel_values"] - want).abs().max()) < 1e-6, mode
    # a folder of image files, one folder per class under one per split: the label is the class folder's
    for split, n in (("train", 12), ("test", 4)):
        for k, cls in enumerate(("cat", "dog")):
            (tmp_path / "files" / split / cls).mkdir(parents=True)
            for j in range(n):
                Image.fromarray(np.full((8, 8, 3), 40 + 150 * k, dtype=np.uint8)).save(tmp_path / "files" / split / cls / f"{j}.png")
    got = {s: load_batches(rgb, f"hf:{tmp_path / 'files'}", s, 64)[0] for s in ("train", "validation", "test")}
    assert {s: len(b["labels"]) for s, b in got.items()} == {"train": 22, "validation": 2, "test": 8}
    for b in got.values():  # each image's class is its label (cat 40, dog 190)
        assert torch.equal(b["pixel_values"][:, 0, 0, 0] > 0.5, b["labels"] == 1)  # (pixel / 255 - 0.3) / 0.4
    datasets.Dataset.from_dict({"image": list(imgs[:20]), "label": labels[:20]}).save_to_disk(tmp_path / "img-one")
    sizes = [len(load_batches(vit, f"hf:{tmp_path / 'img-one'}", s, 64)[0]["labels"]) for s in ("train", "validation", "test")]
    assert sizes == [18, 1, 1]  # 90/5/5 of 20 rows, as a text file's windows
    datasets.Dataset.from_dict({"image": list(imgs[:2]), "label": labels[:2]}).save_to_disk(tmp_path / "img-two")
    with pytest.raises(SymmergeError, match=r"has only 2 images; .* \(use more images, or --split all\)"):
        load_batches(vit, f"hf:{tmp_path / 'img-two'}", "test", 64)


def test_cli_eval_prints_and_writes_json(tmp_path, text, text_file, capsys):
    path = lm_folder(tmp_path / "m", text)
    out = tmp_path / "r.json"
    assert main(["eval", str(path), "--data", str(text_file), "--batch-size", "4", "--max-batches", "3", "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    model = T.AutoModelForCausalLM.from_pretrained(path)
    assert rec["loss"] == pytest.approx(evaluate(model, load_batches(path, str(text_file), "test", 4, max_batches=3))["loss"], abs=1e-6)
    # negative control: the same windows of another split
    assert abs(rec["loss"] - evaluate(model, load_batches(path, str(text_file), "validation", 4, max_batches=3))["loss"]) > 1e-4
    assert "loss/token" in capsys.readouterr().out
    assert main(["eval", str(tmp_path / "nope"), "--data", str(text_file)]) == 2
    assert "not a folder" in capsys.readouterr().err
