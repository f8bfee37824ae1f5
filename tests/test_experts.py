"""Mixtures of experts (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE): the expert permutation, the per-expert FFN groups and
Qwen2-MoE's shared expert against the stock forward, their negative controls, the per-expert storage of stock
checkpoints, and planted recovery by weight matching.

The property tests of every family (tests/test_symmetry.py) cover each class's group element by element, and
tests/test_qk_norm.py OLMoE's and Qwen3-MoE's QK-norm; here are the parts that only a mixture of experts has.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import transformers as T
from safetensors.torch import save_file

from checks import assert_different_function, assert_same_function, gap, with_tensor_of
from factories import EXPERTS, example_inputs, loaded_with_logits, logits, make_config, rel_distance, stock_logits
from symmerge import cli
from symmerge.adapters import adapter_for
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.store.model import load_model

pytestmark = pytest.mark.usefixtures("one_thread")


#: one expert's down projection as stock `save_pretrained` writes it
STORED_DOWN = {"mixtral": "model.layers.0.block_sparse_moe.experts.3.w2.weight",
               "olmoe": "model.layers.0.mlp.experts.3.down_proj.weight",
               "qwen2_moe": "model.layers.0.mlp.experts.3.down_proj.weight",
               "qwen3_moe": "model.layers.0.mlp.experts.3.down_proj.weight",
               "granitemoe": "model.layers.0.block_sparse_moe.output_linear.weight"}  # every expert in one tensor


@pytest.fixture(scope="module", params=sorted(EXPERTS))
def moe(tmp_path_factory, request):
    """(canonical model, the logits of its stock forward) of a tiny float64 mixture of experts."""
    return loaded_with_logits(request.param, tmp_path_factory.mktemp(request.param) / "m")


def _forward(model, params):
    return stock_logits(model, params, example_inputs(model.shape.arch))


def _stock_class(model):
    return getattr(T, make_config(model.shape.arch).architectures[0])


def _without(spec, tensors: tuple[str, ...], suffix: str, how: str | None = None):
    """`spec` with the actions of the groups ending in `suffix` (and of kind `how`, if given) dropped from the
    tensors whose names end in one of `tensors`: the wrong action of a negative control."""
    def keep(name, a):
        return not (name.endswith(tensors) and a.group.endswith(suffix) and how in (None, a.how))

    return dataclasses.replace(spec, actions={k: [a for a in v if keep(k, a)] for k, v in spec.actions.items()})


def test_the_spec_states_the_expert_group(moe):
    spec = moe[0].spec
    assert "expert_perm" in spec.families()
    experts, ffn, glu = (spec.groups[f"blocks.1.{n}"] for n in ("experts", "ffn", "glu"))
    assert (experts.kind, experts.size, experts.batch) == ("permutation", 4, ())
    assert "router" in experts.note and "top 2 of 4" in experts.note
    assert (ffn.size, ffn.batch, ffn.indexed_by) == (24, (4,), "blocks.1.experts")
    assert (glu.batch, glu.indexed_by) == ((4,), "blocks.1.ffn")
    assert spec.application_order()[-2:] == ["blocks.0.experts", "blocks.1.experts"]  # after what they re-index
    assert {a.group for a in spec.actions["blocks.0.moe.W_router"]} == {"residual.rotation", "blocks.0.experts"}


def test_inspect_shows_the_expert_group(moe, capsys):
    assert cli.main(["inspect", str(moe[0].path)]) == 0
    out = capsys.readouterr().out
    assert "expert_perm" in out and "router" in out


@pytest.mark.parametrize("tensors,suffix,how,what", [
    (("W_router",), ".experts", None, "experts relabelled, the router's rows not"),
    (("W_in", "W_gate", "W_out"), ".experts", None, "the router's rows permuted, the experts not"),
    (("W_out",), ".ffn", None, "an expert's units permuted in up and gate, not in down"),
    (("W_out",), ".glu", None, "an expert's GLU scale on up, not undone on down"),
])
def test_wrong_expert_actions_change_the_logits(moe, tensors, suffix, how, what):
    model, ref = moe
    family = {".experts": "expert_perm", ".ffn": "ffn_perm", ".glu": "glu_scale"}[suffix]
    g = random_element(model.spec, torch.Generator().manual_seed(2), [family])
    right = _forward(model, apply(model.spec, g, model.params))
    assert_same_function(right, ref, dtype=torch.float32, what=f"{family} as the spec says")
    wrong = _forward(model, apply(_without(model.spec, tensors, suffix, how), g, model.params))
    assert gap(wrong, ref, dtype=torch.float32) > 100, what


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """(canonical model, stock logits) of the tiny Qwen2-MoE: a shared expert beside the experts of each mixture."""
    return loaded_with_logits("qwen2_moe", tmp_path_factory.mktemp("qwen2_moe") / "m")


def test_the_spec_states_the_shared_expert(shared, capsys):
    model = shared[0]
    spec, s = model.spec, model.shape
    units, scale = spec.groups["blocks.0.shared"], spec.groups["blocks.0.shared_glu"]
    assert (units.family, units.kind, units.size, units.batch, units.indexed_by) == ("ffn_perm", "permutation", s.d_shared, (), None)
    assert (scale.family, scale.size, scale.indexed_by) == ("glu_scale", s.d_shared, "blocks.0.shared")
    assert {a.group for a in spec.actions["blocks.0.moe.W_shared_router"]} == {"residual.rotation"}  # a reader, no unit
    # inspect gives the experts' and the shared expert's units a row each (they differ in size and reason)
    assert cli.main(["inspect", str(model.path), "--json"]) == 0
    rows = [f for f in json.loads(capsys.readouterr().out)["families"] if f["family"] == "ffn_perm"]
    assert [(r["size"], r["copies"]) for r in rows] == [(s.d_mlp, s.n_layers * s.n_experts), (s.d_shared, s.n_layers)]


@pytest.mark.parametrize("tensors,suffix,family,what", [
    (("W_shared_out",), ".shared", "ffn_perm", "the shared expert's units permuted in up and gate, not in down"),
    (("W_shared_out",), ".shared_glu", "glu_scale", "the shared expert's GLU scale on up, not undone on down"),
    (("W_shared_router",), ".rotation", "residual_rotation", "the shared expert's gate left unturned"),
])
def test_wrong_shared_expert_actions_change_the_logits(shared, tensors, suffix, family, what):
    model, ref = shared
    g = random_element(model.spec, torch.Generator().manual_seed(2), [family])
    assert_same_function(_forward(model, apply(model.spec, g, model.params)), ref, dtype=torch.float32,
                         what=f"{family} as the spec says")
    wrong = _forward(model, apply(_without(model.spec, tensors, suffix), g, model.params))
    assert gap(wrong, ref, dtype=torch.float32) > 100, what


def test_per_expert_files_are_read_and_written(moe, tmp_path):
    """Stock `save_pretrained` stores each expert's w1, w2, w3 on its own; a checkpoint holding the fused tensors
    under the class's names reads the same; symmerge writes what stock writes, and stock loads it."""
    model, ref = moe
    stored = json.loads((model.path / "model.safetensors.index.json").read_text())["weight_map"] \
        if (model.path / "model.safetensors.index.json").exists() else None
    from safetensors import safe_open

    with safe_open(str(model.path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert stored is None and STORED_DOWN[model.shape.arch] in names
    fused = tmp_path / "fused"
    fused.mkdir()
    (fused / "config.json").write_text((model.path / "config.json").read_text())
    hf = _stock_class(model).from_pretrained(model.path, dtype=torch.float64)  # the class holds the fused tensors
    save_file({k: v.clone().contiguous() for k, v in hf.state_dict().items()}, str(fused / "model.safetensors"))
    other = load_model(fused)
    assert all(torch.equal(other.params[k], v) for k, v in model.params.items())
    # negative control: experts 0 and 1 swapped in the fused tensors read as other parameters
    swap = {k: v[[1, 0, *range(2, v.shape[0])]].contiguous() if ".experts." in k and v.dim() == 3 else v.clone().contiguous()
            for k, v in hf.state_dict().items()}
    save_file(swap, str(fused / "model.safetensors"))
    swapped = load_model(fused).params
    assert any(not torch.equal(swapped[k], v) for k, v in model.params.items())

    out = tmp_path / "out"
    assert cli.main(["transform", str(model.path), "-o", str(out), "--seed", "3"]) == 0
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert set(f.keys()) - {"lm_head.weight"} == names - {"lm_head.weight"}  # a tied head is written untied
    hf_out = _stock_class(model).from_pretrained(out, experts_implementation="eager").eval()
    x = example_inputs(model.shape.arch)
    assert_same_function(logits(hf_out, x), ref, dtype=torch.float32, what="transformed")
    # negative control: the written checkpoint with one reader of the residual stream left as A has it
    hf_a = _stock_class(model).from_pretrained(model.path, experts_implementation="eager").eval()
    assert_different_function(logits(with_tensor_of(hf_out, hf_a), x), ref, dtype=torch.float32, what="one reader as A's")


def test_transform_then_align_recovers_a(moe, tmp_path):
    """A planted copy (`transform --seed`) is aligned back exactly by weight matching: experts, units, and
    every other group."""
    model, ref = moe
    a, b, c = model.path, tmp_path / "b", tmp_path / "c"
    assert cli.main(["transform", str(a), "-o", str(b), "--seed", "4"]) == 0
    assert cli.main(["align", str(a), str(b), "-o", str(c), "--json", str(tmp_path / "r.json"), "--groups", "all"]) == 0
    A, B, C = (load_model(x) for x in (a, b, c))
    assert rel_distance(B.params, A.params) > 0.5
    assert rel_distance(C.params, A.params) <= 1e-5
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["objective"][-1] > 1 - 1e-10 and rep["objective"][0] < 0.5
    assert rep["families"]["expert_perm"]["experts_moved"] > 0 and rep["families"]["ffn_perm"]["units_moved"] > 0
    hf_c, hf_b = (_stock_class(model).from_pretrained(x, experts_implementation="eager").eval() for x in (c, b))
    x = example_inputs(model.shape.arch)
    assert_same_function(hf_c, hf_b, x, what="aligned")
    assert_same_function(logits(hf_c, x), ref, dtype=torch.float32, what="aligned, against A")
    router = f"{model.adapter.moe}.{model.adapter.router}.weight"  # the class's name of a router's weight
    shuffled = {k: (v.flip(0) if k.endswith(router) else v) for k, v in hf_c.state_dict().items()}
    assert sum(k.endswith(router) for k in shuffled) == sum(map(model.shape.experts_in, range(model.shape.n_layers)))
    hf_c.load_state_dict(shuffled)
    assert_different_function(hf_c, hf_b, x, what="the router's rows reversed")


def _qwen3_moe_every_other(tmp_path):
    """A Qwen3-MoE whose decoder_sparse_step (2) makes layer 0 dense (an MLP of width 40) and layer 1 a mixture."""
    config = make_config("qwen3_moe")
    config.decoder_sparse_step = 2
    hf = _saved_stock(T.Qwen3MoeForCausalLM, config, tmp_path / "m")
    return load_model(tmp_path / "m"), logits(hf, example_inputs("qwen3_moe"))


def _saved_stock(cls, config, folder):
    """A tiny float64 stock `cls` of `config` (norm weights about 1, larger weights), saved in `folder`; in eval mode."""
    torch.manual_seed(0)
    hf = cls(config).to(torch.float64)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1 + 0.5 * torch.randn_like(p)) if "norm" in name else p.mul_(3.0)
    hf.save_pretrained(folder)
    return hf.eval()


def test_dense_layers_of_a_mixture(tmp_path):
    """Qwen3-MoE's dense layers (`decoder_sparse_step`, `mlp_only_layers`) are read as the stock decoder builds
    them: the FFN group of their own width there, the expert group elsewhere; a random element of every family
    keeps the stock forward, and a dense layer's FFN permutation left off its down projection does not."""
    model, stock = _qwen3_moe_every_other(tmp_path)
    s, spec = model.shape, model.spec
    assert (s.dense_layers, s.d_mlp_dense, s.d_mlp) == ((0,), 40, 24)
    assert (spec.groups["blocks.0.ffn"].size, spec.groups["blocks.0.ffn"].batch) == (40, ())
    assert "blocks.0.experts" not in spec.groups and spec.groups["blocks.1.ffn"].batch == (4,)
    assert "blocks.0.mlp.W_in" in model.params and "blocks.1.moe.W_router" in model.params
    ref = _forward(model, model.params)
    assert_same_function(ref, stock, dtype=torch.float32, what="read and written back")
    g = random_element(spec, torch.Generator().manual_seed(5))
    assert_same_function(_forward(model, apply(spec, g, model.params)), ref, dtype=torch.float32, what="every family")
    wrong = _forward(model, apply(_without(spec, ("blocks.0.mlp.W_out",), ".ffn"), g, model.params))
    assert gap(wrong, ref, dtype=torch.float32) > 100, "the dense layer's units permuted in up and gate, not in down"
    only = make_config("qwen3_moe")
    only.mlp_only_layers = [1]
    assert adapter_for(only).shape(only).dense_layers == (1,)
    only.num_experts = 0  # no mixture anywhere: Qwen3's dense MLPs, of width intermediate_size
    assert (adapter_for(only).shape(only).n_experts, adapter_for(only).shape(only).d_mlp) == (0, 40)


def test_an_empty_shared_expert_is_written_as_stock_stores_it(tmp_path):
    """Qwen2-MoE with `shared_expert_intermediate_size=0`: the stock mixture still holds a shared expert (empty
    projections, a gate whose output multiplies nothing). It has no group; a moved copy is written with the empty
    tensors a stock checkpoint stores, loads strictly in the stock class, and computes the source's function."""
    config = make_config("qwen2_moe")
    config.shared_expert_intermediate_size = 0
    hf = _saved_stock(T.Qwen2MoeForCausalLM, config, tmp_path / "m")
    x = example_inputs("qwen2_moe")
    ref = logits(hf, x)
    model = load_model(tmp_path / "m")
    assert model.shape.d_shared == 0 and not any("shared" in k for k in model.params)
    assert cli.main(["transform", str(tmp_path / "m"), "-o", str(tmp_path / "t"), "--seed", "3"]) == 0
    moved = T.Qwen2MoeForCausalLM.from_pretrained(tmp_path / "t", experts_implementation="eager").eval()
    assert moved.model.layers[0].mlp.shared_expert.down_proj.weight.shape == (32, 0)
    assert rel_distance(load_model(tmp_path / "t").params, model.params) > 0.5
    assert_same_function(logits(moved, x), ref, dtype=torch.float32, what="moved, empty shared expert")
    shuffled = {k: (v.flip(0) if k.endswith("mlp.gate.weight") else v) for k, v in moved.state_dict().items()}
    moved.load_state_dict(shuffled)
    assert_different_function(logits(moved, x), ref, dtype=torch.float32, what="the router's rows reversed")
