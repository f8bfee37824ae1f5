"""What the learned- and dual-matching tests share (their pair of tiny GPT-2s is conftest's `pair`
fixture): a quick configuration, the stock forward of canonical parameters, and the plain path of the
learning objective (what the learner's block-wise forward must equal)."""

from __future__ import annotations

import torch

from symmerge.algebra.apply import apply
from symmerge.evaluation.forward import StockForward, interpolate
from symmerge.match.learn_config import LearnConfig
from symmerge.store.model import build_hf_model, export_state_dict

#: the continuous families (what dual matching learns)
CONTINUOUS = ["residual_rotation", "qk_map", "ov_map"]


def quick(**kw) -> LearnConfig:
    """A few steps, validation every three: enough to exercise the loop in well under a second."""
    base = dict(steps=6, lr=0.05, eval_every=3, grid_points=3, extend=1.0, progress=False)
    return LearnConfig(**{**base, **kw})


def logits_of(model, params, batch):
    """The stock HF forward of `model`'s class on canonical `params` (float64)."""
    config, sd = export_state_dict(model, params, dtype=torch.float64)
    with torch.no_grad():
        return build_hf_model(config, sd, model.shape.hf_class)(input_ids=batch["input_ids"]).logits


def cast_element(g: dict, dtype) -> dict:
    """An element with its floating tensors cast to `dtype` (permutations as they are)."""
    return {n: (t.to(dtype) if torch.is_tensor(t) and t.is_floating_point() else t) for n, t in g.items()}


def plain_loss(model, learner, batch, lam, elements: dict | None = None, dtype=torch.float32) -> torch.Tensor:
    """The plain path of the objective: both endpoints whole in `dtype`, each moved by its element through
    `apply` (default: the learner's training elements, cast to `dtype`), interpolated, and the stock HF loss
    of the result (`StockForward` of `model`'s class, one full state dict)."""
    elements = elements or {side: cast_element(learner.element(side, hard=False), dtype) for side in learner.base}
    ends = {}
    for side in ("A", "B"):
        params = {k: v.to(dtype) for k, v in learner.frozen[side].params().items()}
        ends[side] = apply(learner.spec, elements[side], params) if side in elements else params
    return StockForward(model, dtype).loss(interpolate(ends["A"], ends["B"], lam), batch)


def learned_align(a, b, train: list[dict], val: list[dict], cfg: LearnConfig, out, force: bool = False,
                  resume: bool = False) -> dict:
    """Learn, write OUT and return the report: `learned.learn` between the pieces of `match.outputs` that
    `symmerge align` puts around its run (`open_checkpoint`, `finish_learned`, checked on the first validation
    batch)."""
    from symmerge.match.learned import learn
    from symmerge.match.outputs import finish_learned, open_checkpoint

    ckpt = open_checkpoint(out, force, resume)
    result = learn(a, b, train, val, cfg, checkpoint=ckpt, resume=resume)
    return finish_learned(result, a, b, out, force, val[0], ckpt)


def char_pair(folder, chars: int):
    """Two tiny character GPT-2s (context 32, seeds 0 and 1) in folder/m0 and folder/m1, and the first
    `chars` characters of Tiny Shakespeare in folder/text.txt: (the pair's align arguments, tokenizer, text)."""
    import transformers as T

    from conftest import shared_data
    from symmerge.data.tokenizers import char_tokenizer

    text = shared_data("tinyshakespeare.txt").read_text()[:chars]
    (folder / "text.txt").write_text(text)
    tok = char_tokenizer(text)
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=24, n_layer=2, n_head=3, n_positions=32, vocab_size=len(tok)))
        model.save_pretrained(folder / f"m{seed}")
        tok.save_pretrained(folder / f"m{seed}")
    return [str(folder / "m0"), str(folder / "m1"), "--data", str(folder / "text.txt")], tok, text
