"""The block-wise forward of learned and dual matching (`match/blockwise.py`): on every architecture, in
float32 and bfloat16, its loss and its gradients to the group parameters are the plain path's (both
endpoints whole in float32, moved by `apply`, interpolated, the stock HF loss of one full state dict),
to a tolerance from the dtype; a wrong block order and a perturbed element fall outside it. Endpoints
read lazily from bf16 files stay bf16; outputs learned in bfloat16 compute their inputs' functions.

Tolerances: the loss to `checks.tolerance(dtype, loss, LOSS_ULPS)`; each gradient to GRAD_ULPS·eps(dtype)
relative to its norm (bf16 rounds every weight and activation, which moves the gradients of these tiny
models by 1.5-3 eps; float32 differs from the plain path only in the order gradients are summed, 2-10 eps).
"""

from __future__ import annotations

import pytest
import torch

from checks import assert_reported_gap, tolerance
from factories import ARCHS, lm_batches, make_model, save_model
from learned_common import plain_loss, quick
from symmerge.algebra.elements import random_element
from symmerge.evaluation.forward import model_inputs
from symmerge.match import blockwise
from symmerge.match.blockwise import BlockwiseForward, kept_for_backward
from symmerge.match.frozen import Frozen
from symmerge.match.learned import learn
from symmerge.match.learner import Learner
from symmerge.match.outputs import output_report, save_outputs
from symmerge.store.model import LazyModel, load_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread

LOSS_ULPS, GRAD_ULPS = 4, 32
LAM = 0.4


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Per architecture: two tiny float64 checkpoints in memory and a random initial element."""
    root = tmp_path_factory.mktemp("pairs")
    out = {}
    for arch in ARCHS:
        a, b = (load_model(save_model(make_model(arch, s), root / f"{arch}{s}")) for s in (0, 1))
        out[arch] = (a, b, random_element(b.spec, torch.Generator().manual_seed(7)))
    return out


def batch_for(arch: str, seed: int = 0) -> dict:
    if arch == "vit":
        gen = torch.Generator().manual_seed(seed)
        return {"pixel_values": torch.randn(3, 1, 8, 8, generator=gen, dtype=torch.float64),
                "labels": torch.randint(0, 10, (3,), generator=gen)}
    return lm_batches(1, seed, size=3, length=10)[0]


def loss_and_grads(learner, loss):
    params = list(learner.trainables().values())
    return float(loss.detach()), [g.detach().double() for g in torch.autograd.grad(loss, params)]


def gaps(got, ref, dtype) -> tuple[float, float]:
    """(loss difference, largest relative gradient difference), each in tolerances of `dtype`."""
    (loss, grads), (ref_loss, ref_grads) = got, ref
    d_loss = abs(loss - ref_loss) / tolerance(dtype, torch.tensor(ref_loss), LOSS_ULPS)
    d_grad = max(float((g - r).norm() / r.norm()) for g, r in zip(grads, ref_grads)) / (GRAD_ULPS * torch.finfo(dtype).eps)
    return d_loss, d_grad


def reversed_blocks(part, n_layers: int):
    """A part function that feeds block i the tensors of its mirror among the blocks of its kind (the wrong block
    order; a mixture of experts' dense layers are mirrored among themselves)."""
    kinds: dict = {}
    for i in range(n_layers):
        kinds.setdefault(frozenset(k.split(".", 2)[2] for k in part(i)), []).append(i)
    mirror = {i: same[len(same) - 1 - k] for same in kinds.values() for k, i in enumerate(same)}

    def wrong(key, rows=None):
        if not isinstance(key, int):
            return part(key, rows)
        j = mirror[key]
        return {k.replace(f"blocks.{j}.", f"blocks.{key}.", 1): v for k, v in part(j).items()}
    return wrong


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("method", ["learned", "dual"])
def test_blockwise_loss_and_gradients_equal_the_plain_path(pairs, arch, method):
    a, b, init = pairs[arch]
    batch = batch_for(arch)
    for dtype_name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        learner = Learner(a, b, quick(method=method, dtype=dtype_name), init)
        if dtype_name == "bfloat16":
            learner.forward.head_rows = 7  # the head in chunks of 7 rows (the default takes these heads whole)
        ref = loss_and_grads(learner, plain_loss(a, learner, batch, LAM))
        assert all(float(g.abs().max()) > 0 for g in ref[1]), "every slot gets a gradient on the plain path"
        d_loss, d_grad = gaps(loss_and_grads(learner, learner.loss(batch, LAM)), ref, dtype)
        assert d_loss <= 1 and d_grad <= 1, f"{arch}/{method}/{dtype_name}: loss {d_loss:.3g}, gradients {d_grad:.3g} tolerances"
        # negative controls: the blocks in reverse order, and a slightly moved element, are caught
        wrong = learner.forward.loss(reversed_blocks(learner.path(LAM, hard=False), a.shape.n_layers), batch)
        assert max(gaps(loss_and_grads(learner, wrong), ref, dtype)) > 2, f"{arch}/{method}/{dtype_name}: wrong block order"
        # the residual rotation where it is learned; post-norm models keep their signed permutation fixed: every
        # continuous group they learn
        rotation = [s for s in learner.slots if s.group == "residual.rotation"]
        moved_slots = rotation or [s for s in learner.slots if not a.spec.groups[s.group].discrete]
        with torch.no_grad():
            for t in (t for slot in moved_slots for t in slot.raw.values()):
                t.add_(0.2 * torch.randn(t.shape, generator=torch.Generator().manual_seed(1), dtype=t.dtype))
        moved = loss_and_grads(learner, learner.loss(batch, LAM))
        assert max(gaps(moved, ref, dtype)) > 2, f"{arch}/{method}/{dtype_name}: a moved element is not seen"


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "llama", "olmo", "vit"])
def test_what_the_backward_recomputes_changes_nothing(pairs, arch):
    """recompute="block" (weights and activations), "weights" (weights only, activations kept), "none" and "auto"
    (which keeps everything on a tiny model's batch) give bit-identical losses and gradients. Negative control:
    another lambda changes them."""
    a, b, init = pairs[arch]
    batch = batch_for(arch)
    learner = Learner(a, b, quick(method="learned"), init)
    learner.forward.head_rows = 4
    runs = {}
    for mode in ("none", "block", "weights", "auto"):
        learner.forward.recompute = mode
        runs[mode] = loss_and_grads(learner, learner.loss(batch, LAM))
        assert learner.forward.mode == ("none" if mode == "auto" else mode), f"{mode} ran as {learner.forward.mode}"
    for mode in ("block", "weights", "auto"):
        assert runs[mode][0] == runs["none"][0] and all(torch.equal(g, r) for g, r in zip(runs[mode][1], runs["none"][1])), mode
    other = loss_and_grads(learner, learner.loss(batch, LAM + 0.1))
    assert other[0] != runs["none"][0] and not all(torch.equal(g, r) for g, r in zip(other[1], runs["none"][1]))


def saved_bytes(step) -> int:
    """Bytes of the distinct storages the autograd graph of `step()` saves for its backward."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(storages.values())


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "llama", "mixtral", "vit"])
@pytest.mark.parametrize("size", [3, 48])
def test_auto_recompute_estimates_what_keeping_everything_keeps(pairs, arch, size, monkeypatch):
    """`kept_for_backward` bounds, from above and within 5x, the bytes that recompute="none" saves beyond "block"'s,
    on a batch where the weights dominate and on one where the activations do; "auto" keeps everything below
    `AUTO_KEEP_BYTES` and recomputes blocks above it."""
    a, b, init = pairs[arch]
    batch = batch_for(arch) if size == 3 else (
        {"pixel_values": torch.randn(8 * size, 1, 8, 8, dtype=torch.float64), "labels": torch.randint(0, 10, (8 * size,))}
        if arch == "vit" else lm_batches(1, 0, size=size, length=24)[0])
    learner = Learner(a, b, quick(method="dual"), init)
    kept = {}
    for mode in ("block", "none"):
        learner.forward.recompute = mode
        kept[mode] = saved_bytes(lambda: learner.loss(batch, LAM))
    inputs = model_inputs(batch, torch.float32)
    estimate = kept_for_backward(a.shape, *blockwise._tokens(inputs, a.shape), 4)
    measured = kept["none"] - kept["block"]
    assert measured <= estimate <= 5 * measured, f"{arch}: estimate {estimate} for {measured} bytes kept"
    learner.forward.recompute = "auto"
    assert learner.forward.resolved(inputs) == "none"
    monkeypatch.setattr(blockwise, "AUTO_KEEP_BYTES", estimate - 1)
    assert learner.forward.resolved(inputs) == "block"


@pytest.mark.parametrize("d, layers, heads, tokens", [(768, 12, 12, 512), (2048, 24, 16, 64)])
def test_auto_recompute_keeps_block_at_pythia_shapes(d, layers, heads, tokens):
    """At Pythia-160M and -1.4B shapes in bf16 (where `learned_memory.py` holds the memory target) "auto" recomputes
    each block, even for one short window."""
    from symmerge.algebra.shape import ModelShape

    shape = ModelShape(arch="gpt_neox", hf_class="GPTNeoXForCausalLM", d_model=d, n_layers=layers, n_heads=heads,
                       n_kv_heads=heads, d_head=d // heads, d_mlp=4 * d, vocab=50304, norm="layernorm", gated=False,
                       parallel=True, rotary_dims=d // heads // 4, rotary_layout="half", tied=False, eps=1e-5,
                       eps_in_config=True, activation="gelu")
    assert kept_for_backward(shape, tokens, tokens, 2) > blockwise.AUTO_KEEP_BYTES


def test_auto_recompute_is_block_over_sharded_endpoints(pairs):
    """Endpoints whose parts are collectives (`Sharded`) take "block" under "auto": the choice may not follow one
    process's batch. Control: the same endpoints, not collective, keep "auto"."""
    a, b, _ = pairs["llama"]
    ends = [Frozen(a), Frozen(b)]
    assert BlockwiseForward(a, ends, torch.float32).recompute == "auto"
    ends[1].collective = True
    assert BlockwiseForward(a, ends, torch.float32).recompute == "block"


def shifted_rows(part):
    """A part function that feeds every row-fed module the rows one further on (the wrong rows)."""
    def wrong(key, rows=None):
        if rows is None:
            return part(key)
        out = {}
        for name, r in rows.items():
            whole = part(key, {name: None})[name]
            idx = torch.arange(whole.shape[0])[r if r is not None else slice(None)]
            out[name] = whole[(idx + 1) % whole.shape[0]]
        return out
    return wrong


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "vit"])
def test_embeddings_and_heads_are_fed_by_rows(pairs, arch):
    """Language models' embeddings (token and position) and heads are row-fed modules: the forward never
    materialises them whole (the embedding only the batch's distinct ids, the head `head_rows` rows at a time),
    and what they compute is what the whole tables compute (the equality tests above). Negative control: rows
    one further on change the loss."""
    a, b, init = pairs[arch]
    learner = Learner(a, b, quick(method="dual"), init)
    fed = {c for v in learner.forward.vocab for c in v.tensors.values()}
    assert {"embed.W_E", "head.W_U"} <= fed, fed
    assert not fed & {k for key in ("embed", "final") for k in learner.forward.rest[key]}
    asked = []

    def spy(key, rows=None):
        asked.append((key, None if rows is None else {k: r for k, r in rows.items()}))
        return part(key, rows)

    part = learner.path(LAM, hard=False)
    batch = batch_for(arch)
    learner.forward.head_rows = 16
    with torch.no_grad():
        loss = float(learner.forward.loss(spy, batch))
        wrong = float(learner.forward.loss(shifted_rows(part), batch))
    embed = [r["embed.W_E"] for k, r in asked if r and "embed.W_E" in r]
    head = [r["head.W_U"] for k, r in asked if r and "head.W_U" in r]
    assert len(embed) == 1 and torch.equal(embed[0], torch.unique(batch["input_ids"]))
    assert [(s.start, s.stop) for s in head] == [(i, min(i + 16, 61)) for i in range(0, 61, 16)]
    ends = [r for k, r in asked if k in ("embed", "final")]
    assert all(r is not None and all(r[c] is not None for c in fed & set(r)) for r in ends), "no end part asked for whole"
    assert abs(wrong - loss) > 1e-3, "rows one further on must change the loss"


def test_padding_rows_get_no_gradient_as_in_the_stock_embedding(tmp_path):
    """A model whose embedding has a padding index, on a batch holding that id: the row-fed embedding moves the
    index along with the rows it keeps, so the loss and gradients are the plain path's (whose stock embedding
    gives the padding row no gradient); the padding changes those gradients, so the check can fail."""
    models = []
    for s in (0, 1):
        m = make_model("llama", s)
        m.config.pad_token_id = 30  # in batch_for's ids
        models.append(load_model(save_model(m, tmp_path / str(s))))
    a, b = models
    init = random_element(b.spec, torch.Generator().manual_seed(3))
    batch = batch_for("llama")
    assert 30 in batch["input_ids"]
    learner = Learner(a, b, quick(method="learned"), init)
    assert learner.forward.hf.get_submodule("model.embed_tokens").stock.padding_idx == 30
    ref = loss_and_grads(learner, plain_loss(a, learner, batch, LAM))
    d_loss, d_grad = gaps(loss_and_grads(learner, learner.loss(batch, LAM)), ref, torch.float32)
    assert d_loss <= 1 and d_grad <= 1, (d_loss, d_grad)
    a.config.pad_token_id = None
    unpadded = loss_and_grads(learner, plain_loss(a, learner, batch, LAM))
    assert gaps(unpadded, ref, torch.float32)[1] > 2, "the padding index must matter to the gradients"


def test_lazy_bf16_endpoints_stay_bf16(tmp_path):
    """Endpoints read from bf16 files block by block are kept in bf16 (no float32 copy; the canonical form
    adds only LayerNorm-folded zero biases), and give the same loss as the same checkpoints loaded whole."""
    paths = [save_model(make_model("gpt_neox", s, dtype=torch.bfloat16), tmp_path / str(s)) for s in (0, 1)]
    lazy, whole = [LazyModel(p) for p in paths], [load_model(p) for p in paths]
    init = random_element(whole[1].spec, torch.Generator().manual_seed(2))
    batch = batch_for("gpt_neox")
    losses = []
    for a, b in (lazy, whole):
        learner = Learner(a, b, quick(method="dual", dtype="bfloat16"), init)
        for f in learner.frozen.values():
            assert {t.dtype for t in f.params().values() if t.dim() > 0} == {torch.bfloat16}
        losses.append(float(learner.loss(batch, LAM).detach()))
    assert losses[0] == losses[1]
    stored = sum(t.numel() * 2 for t in make_model("gpt_neox", 0).parameters())
    assert Frozen(lazy[0]).nbytes() <= 1.1 * stored


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "llama", "olmo", "vit"])
def test_outputs_learned_in_bfloat16_compute_their_inputs(pairs, arch, tmp_path):
    """Learned and dual matching in bfloat16 (forward and weights materialised in bf16, elements float64):
    every output loads with stock `from_pretrained` and computes its input's function."""
    a, b, init = pairs[arch]
    train, val, probe = [batch_for(arch, 0), batch_for(arch, 1)], [batch_for(arch, 2)], batch_for(arch, 9)
    for method in ("learned", "dual"):
        result = learn(a, b, train, val, quick(method=method, steps=3, lr=0.1, dtype="bfloat16"), init=init)
        assert result.report["settings"]["dtype"] == "bfloat16" and result.report["barrier_after"] is not None
        for row in output_report(save_outputs(result, a, b, tmp_path / method), a.shape.hf_class, probe):
            assert_reported_gap(row, probe)
