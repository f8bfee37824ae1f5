"""Tokenizers written into model folders, so that stock `AutoTokenizer.from_pretrained(folder)` loads them.

Each builder returns a `transformers.PreTrainedTokenizerFast` wrapping a `tokenizers.Tokenizer`;
`save_pretrained(folder)` writes `tokenizer.json` + `tokenizer_config.json`. Three kinds:

- `char`: one token per character of the corpus (sorted code points) plus `<unk>`; decoding fuses the
  characters back together, so `decode(encode(t)) == t` for any text whose characters were seen.
  `<unk>` is also declared bos and eos (tools such as lm-evaluation-harness need a prefix token): no
  token is added to the vocabulary and nothing is added on encoding, so ids and figures are unchanged.
- `bpe`: byte-level BPE trained on the corpus (`tokenizers.trainers.BpeTrainer`), vocabulary size
  configurable; byte-level, so every text round-trips.
- `gpt2`: GPT-2's published byte-level BPE, built from `encoder.json` + `vocab.bpe` found in a folder
  the caller names (the CLI's `--gpt2-bpe DIR`); no path is hard-coded here.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SymmergeError

KINDS = ("char", "bpe", "gpt2")
UNK = "<unk>"
EOT = "<|endoftext|>"
#: accepted file names for GPT-2's vocabulary and merges, in the order they are looked up
GPT2_VOCAB = ("gpt2-encoder.json", "encoder.json", "vocab.json")
GPT2_MERGES = ("gpt2-vocab.bpe", "vocab.bpe", "merges.txt")


def _wrap(tok, **special):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **special)
    fast.model_max_length = int(1e30)  # windows are cut by the data loader, never by the tokenizer
    return fast


def char_tokenizer(text: str):
    """Character-level: vocabulary = the sorted distinct characters of `text`, then `<unk>`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(set(text)))}
    vocab[UNK] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # one pre-token per character, newlines included ([\s\S] matches everything)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return _wrap(tok, unk_token=UNK, bos_token=UNK, eos_token=UNK)


def bpe_tokenizer(text: str, vocab_size: int = 2048):
    """Byte-level BPE trained on `text` (deterministic for a given text and vocab size)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257 + 1:
        raise SymmergeError(f"--vocab-size {vocab_size} is too small for byte-level BPE; use at least 258")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer=trainer)
    return _wrap(tok, eos_token=EOT, bos_token=EOT)


def _find(folder: Path, names: tuple[str, ...]) -> Path:
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise SymmergeError(f"{folder} has none of {', '.join(names)}; pass --gpt2-bpe pointing at GPT-2's encoder.json and vocab.bpe")


def gpt2_tokenizer(bpe_dir: str | Path):
    """GPT-2's byte-level BPE (50,257 tokens) from its published vocabulary and merges files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if bpe_dir is None:
        raise SymmergeError("--tokenizer gpt2 needs --gpt2-bpe DIR (a folder with GPT-2's encoder.json and vocab.bpe)")
    folder = Path(bpe_dir)
    if not folder.is_dir():
        raise SymmergeError(f"--gpt2-bpe {folder} is not a folder; pass the folder holding encoder.json and vocab.bpe")
    vocab, merges = _find(folder, GPT2_VOCAB), _find(folder, GPT2_MERGES)
    try:
        model = models.BPE.from_file(str(vocab), str(merges))
    except Exception as e:  # tokenizers raises its own exception type
        raise SymmergeError(f"cannot read GPT-2 BPE files {vocab.name}/{merges.name}: {e}") from None
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return _wrap(tok, eos_token=EOT, bos_token=EOT, unk_token=EOT)


def build_tokenizer(kind: str, text: str, gpt2_bpe: str | Path | None = None, vocab_size: int = 2048):
    if kind == "char":
        return char_tokenizer(text)
    if kind == "bpe":
        return bpe_tokenizer(text, vocab_size)
    if kind == "gpt2":
        return gpt2_tokenizer(gpt2_bpe)
    raise SymmergeError(f"unknown tokenizer {kind!r}; choose one of {', '.join(KINDS)}")


def load_tokenizer(model_dir: str | Path):
    """The model folder's own tokenizer (tokenizer.json), via stock `AutoTokenizer`."""
    from transformers import AutoTokenizer

    folder = Path(model_dir)
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
        raise SymmergeError(f"{folder} has no tokenizer (tokenizer.json); train with symmerge train or copy the "
                            "tokenizer files of the model into the folder")
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SymmergeError(f"cannot load the tokenizer of {folder}: {str(e).splitlines()[0]}") from None
    return tok


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of `text`, no special tokens added, no truncation (the fast backend directly).

    Text the vocabulary cannot represent is refused rather than scored as `<unk>`: a character
    tokenizer maps every unseen character to that one id, which would make the loss of other data
    look better than it is. (A literal unknown-token string in the text is not counted: GPT-2's
    unknown token is its `<|endoftext|>`.)"""
    ids = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
    unk = tokenizer.unk_token_id
    if unk is not None and ids.count(unk) > text.count(tokenizer.unk_token):
        vocab = tokenizer.get_vocab()
        unseen = sorted({c for c in text if c not in vocab})
        raise SymmergeError(
            f"{ids.count(unk)} tokens of the text are outside the model's vocabulary (characters such as "
            f"{', '.join(repr(c) for c in unseen[:5]) or 'unknown'}); evaluate on text the tokenizer was built "
            "for, or train the models on a corpus that contains these characters")
    return ids
