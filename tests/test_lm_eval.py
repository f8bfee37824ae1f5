"""lm-evaluation-harness itself (optional extra `ecosystem`): `--model hf` with its defaults runs on a
checkpoint carrying symmerge's character tokenizer, and its rolling log-likelihood of a local
perplexity task is symmerge's evaluation of the same tokens.

By construction lm-eval scores every token of a document, the first one after its prefix token (the
tokenizer's bos, `<unk>` for character tokenizers), so the equal figure is symmerge's loss on
[bos] + tokens (n predictions); `symmerge eval` on windows of the bare text scores n - 1 tokens, the
first having no context, and is not the same number."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T

from factories import make_model
from symmerge.data.tokenizers import char_tokenizer, encode
from symmerge.evaluation.forward import evaluate

pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install -e '.[ecosystem]')")

DOCS = ["the cat sat on the mat.", "a dog ran to the park!"]  # shorter than the model's 32 positions


def _task(tmp_path):
    """A perplexity task over a local JSON-lines file (no network), in a folder for lm-eval's TaskManager."""
    data, tasks = tmp_path / "docs.jsonl", tmp_path / "tasks"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    tasks.mkdir()
    (tasks / "tiny_ppl.yaml").write_text(
        "task: symmerge_tiny_ppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {json.dumps(str(data))}\ntest_split: test\noutput_type: loglikelihood_rolling\n"
        'doc_to_text: ""\ndoc_to_target: "{{text}}"\nmetric_list:\n  - metric: word_perplexity\n')
    return tasks


def _run(model_dir, tasks):
    import lm_eval
    from lm_eval.tasks import TaskManager

    res = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model_dir},dtype=float32",
                                  tasks=["symmerge_tiny_ppl"], task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
                                  device="cpu", batch_size=1, log_samples=True)
    samples = sorted(res["samples"]["symmerge_tiny_ppl"], key=lambda s: s["doc_id"])
    return [float(s["resps"][0][0]) for s in samples]


def test_lm_eval_rolling_loglikelihood_is_symmerge_loss(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    model_dir = tmp_path / "model"
    make_model("llama_untied", seed=0, dtype=torch.float32).save_pretrained(model_dir)
    tok = char_tokenizer("".join(DOCS))
    tok.save_pretrained(model_dir)
    tasks = _task(tmp_path)
    got = _run(model_dir, tasks)
    model = T.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for doc, ll in zip(DOCS, got):
        ids = torch.tensor([[tok.bos_token_id, *encode(tok, doc)]])
        rep = evaluate(model, [{"input_ids": ids, "labels": ids}])
        want = -rep["loss"] * len(encode(tok, doc))
        assert abs(ll - want) <= 1e-5 * abs(want), (ll, want)
        bare = torch.tensor([encode(tok, doc)])  # by construction a different figure: n - 1 tokens, no prefix
        assert abs(-evaluate(model, [{"input_ids": bare, "labels": bare}])["loss"] * (bare.shape[1] - 1) - ll) > 1e-3
    # negative control: the character tokenizer as symmerge wrote it before (no bos/eos) fails in lm-eval
    old = tmp_path / "old"
    make_model("llama_untied", seed=0, dtype=torch.float32).save_pretrained(old)
    T.PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, unk_token="<unk>").save_pretrained(old)
    with pytest.raises(TypeError):
        _run(old, tasks)
