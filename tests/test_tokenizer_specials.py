"""The character tokenizer declares bos/eos (`<unk>`, already in its vocabulary) for tools that need a
prefix token, without changing its vocabulary or how any text is encoded."""

from symmerge.data.tokenizers import UNK, char_tokenizer, encode


def test_char_tokenizer_declares_bos_eos_without_changing_ids():
    text = "the cat sat on the mat.\n<unk> x"
    tok = char_tokenizer(text)
    chars = sorted(set(text))
    assert len(tok) == len(chars) + 1  # the characters and <unk>, nothing added
    assert tok.bos_token == tok.eos_token == UNK and tok.bos_token_id == len(chars)
    ids = [chars.index(c) for c in "the cat"]
    assert encode(tok, "the cat") == ids
    assert tok.encode("the cat") == ids and tok("the cat")["input_ids"] == ids  # no bos/eos added on encoding
    assert tok.decode(ids) == "the cat"
