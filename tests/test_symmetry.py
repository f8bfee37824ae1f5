"""Every architecture x every symmetry family x several seeds, against the stock `transformers` forward.

Tolerances come from `finfo`: GPT-2, GPT-NeoX and ViT run LayerNorm in the model's dtype (float64
here); Llama's RMSNorm and OLMo's LayerNorm compute in float32 whatever the model's dtype, so their
logits can only agree to float32 precision.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from checks import NORM_IN_FP32, assert_same_function, gap
from factories import ARCHS, example_inputs, logits, make_config, stock_logits
from symmerge.algebra import groups as G
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import compose, inverse, random_element
from symmerge.store.model import export_state_dict, load_model

SEEDS = (0, 1, 2)


def precision(arch: str) -> torch.dtype:
    """What the float64 test model of `arch` computes in: float32 where its norms compute in float32."""
    return torch.float32 if make_config(arch).model_type in NORM_IN_FP32 else torch.float64


@pytest.fixture(scope="module")
def loaded(model_dirs):
    return {arch: load_model(path) for arch, path in model_dirs.items()}


@pytest.fixture(scope="module")
def references(loaded):
    """Logits of the source checkpoints through the stock forward of the exported canonical form."""
    return {arch: stock_logits(m, m.params, example_inputs(arch)) for arch, m in loaded.items()}


def families_of(arch: str) -> list[str]:
    """The symmetry families of a test architecture, read off its config alone."""
    from factories import make_config
    from symmerge.adapters import adapter_for
    from symmerge.algebra.spec import build_spec

    config = make_config(arch)
    return build_spec(adapter_for(config).shape(config)).families()


def cases():
    return [(arch, fam, seed) for arch in ARCHS for fam in families_of(arch) + ["all"] for seed in SEEDS]


@pytest.mark.parametrize("arch", ARCHS)
def test_canonical_form_computes_the_source_function(arch, model_dirs, loaded, references):
    from factories import make_model

    source = make_model(arch)  # the same weights that were saved
    ref = logits(source, example_inputs(arch))
    assert_same_function(references[arch], ref, dtype=precision(arch), what=f"canonical form of {arch}")


@pytest.mark.parametrize("arch,family,seed", cases())
def test_group_element_preserves_logits_and_inverts(arch, family, seed, loaded, references):
    model = loaded[arch]
    families = None if family == "all" else [family]
    g = random_element(model.spec, torch.Generator().manual_seed(seed), families)
    moved = apply(model.spec, g, model.params)

    ref = references[arch]
    out = stock_logits(model, moved, example_inputs(arch))
    assert_same_function(out, ref, dtype=precision(arch), what=f"{arch} moved by {family}")

    # the parameters really changed (discrete groups on tiny sizes can draw the identity: avoid by seed)
    change = max(float((moved[k] - model.params[k]).abs().max()) for k in model.params)
    assert change > 1e-3, f"{family} left {arch}'s parameters unchanged"

    back = apply(model.spec, inverse(model.spec, g), moved)
    for k, v in model.params.items():
        assert torch.allclose(back[k], v, rtol=0, atol=1e-10 * max(1.0, float(v.abs().max()))), k
    for k, gk in g.items():
        assert G.membership_error(model.spec.groups[k], gk) < 1e-10, k


@pytest.mark.parametrize("arch", ARCHS)
def test_compose_is_sequential_application(arch, loaded):
    model = loaded[arch]
    gen = torch.Generator().manual_seed(5)
    g1, g2 = random_element(model.spec, gen), random_element(model.spec, gen)
    once = apply(model.spec, compose(model.spec, g2, g1), model.params)
    twice = apply(model.spec, g2, apply(model.spec, g1, model.params))
    for k in model.params:
        assert torch.allclose(once[k], twice[k], rtol=1e-9, atol=1e-9), k
    # negative control: composed in the other order (g1 after g2): the groups do not commute
    swapped = apply(model.spec, compose(model.spec, g1, g2), model.params)
    assert max(float((swapped[k] - twice[k]).abs().max()) for k in model.params) > 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_all_groups_move_every_attention_and_ffn_matrix(arch, loaded):
    model = loaded[arch]
    g = random_element(model.spec, torch.Generator().manual_seed(11))
    _, before = export_state_dict(model)
    _, after = export_state_dict(model, apply(model.spec, g, model.params))
    matrices = [k for k in before if before[k].dim() == 2 and "embed" not in k and "wte" not in k
                and "wpe" not in k and "lm_head" not in k and "classifier" not in k]
    assert matrices
    for k in matrices:
        assert float((after[k] - before[k]).norm()) > 0.5 * float(before[k].norm()), k


# --- negative controls: a wrong action must change the logits -------------------------------------------------


def _flip(spec, group_prefix: str, how_from: str, how_to: str):
    """A corrupted spec in which the actions of matching groups use `how_to` instead of `how_from`."""
    actions = {
        k: [dataclasses.replace(a, how=how_to) if a.group.endswith(group_prefix) and a.how == how_from else a for a in v]
        for k, v in spec.actions.items()
    }
    return dataclasses.replace(spec, actions=actions)


def _changed(model, spec, g, arch, references) -> float:
    out = stock_logits(model, apply(spec, g, model.params), example_inputs(arch))
    return gap(out, references[arch], dtype=precision(arch))


def _self_inverse_transpose(arch: str, suffix: str) -> bool:
    """Whether layer 0's group `suffix` of `arch` has G = G^{-T} (signed permutations: clip_qkv, QK-norm signs):
    then reading as a writer is no mistake, and there is nothing to flip."""
    from symmerge.adapters import adapter_for
    from symmerge.algebra.spec import build_spec

    config = make_config(arch)
    group = build_spec(adapter_for(config).shape(config)).groups.get(f"blocks.0{suffix}")
    if group is None or not group.structure.matrix:
        return False
    g = G.random_element(group, torch.Generator().manual_seed(0))
    return torch.equal(g, G.inverse_transpose(group, g))


def reader_cases():
    pairs = [("qk_map", ".qk"), ("ov_map", ".ov"), ("residual_scale", ".scale")]
    return [(a, f, s) for a in ARCHS for f, s in pairs if f in families_of(a) and not _self_inverse_transpose(a, s)]


@pytest.mark.parametrize("arch,family,suffix", reader_cases())
def test_reader_acted_on_as_writer_changes_logits(arch, family, suffix, loaded, references):
    model = loaded[arch]
    g = random_element(model.spec, torch.Generator().manual_seed(3), [family])
    if family == "residual_scale":
        # readers treated as writers: they are scaled like the writers
        def scaled_like_writer(acts):
            reads = [a for a in acts if a.group == "residual.rotation" and a.how == "inv_t"]
            return acts + [dataclasses.replace(a, group="residual.scale", how="g") for a in reads]

        bad = dataclasses.replace(model.spec, actions={k: scaled_like_writer(v) for k, v in model.spec.actions.items()})
    else:
        bad = _flip(model.spec, suffix, "inv_t", "g")
    assert _changed(model, bad, g, arch, references) > 100


@pytest.mark.parametrize("arch", [a for a in ARCHS if make_config(a).model_type in ("gpt2", "gpt_neox", "vit", "olmo")])
def test_layernorm_rotation_must_fix_ones(arch, loaded, references):
    model = loaded[arch]
    group = model.spec.groups["residual.rotation"]
    assert "fixes_ones" in group.constraints
    free = dataclasses.replace(group, constraints=())
    g = {"residual.rotation": G.random_element(free, torch.Generator().manual_seed(4))}
    assert float((g["residual.rotation"] @ torch.ones(group.size, dtype=torch.float64) - 1).abs().max()) > 0.1
    assert _changed(model, model.spec, g, arch, references) > 100


ROTARY = ["gpt_neox", "gpt_neox_seq", "llama", "mistral", "qwen2", "qwen3", "olmo", "phi", "phi3", "gemma", "gemma2"]


@pytest.mark.parametrize("arch", ROTARY)
def test_qk_map_must_commute_with_rope(arch, loaded, references):
    model = loaded[arch]
    name = "blocks.0.qk"
    group = model.spec.groups[name]
    assert "rope" in group.constraints and group.rotary_dims > 0
    free = dataclasses.replace(group, constraints=())
    g = {name: G.random_element(free, torch.Generator().manual_seed(6))}
    assert G.membership_error(group, g[name]) > 1e-3
    assert _changed(model, model.spec, g, arch, references) > 100


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "llama", "mistral", "qwen3", "phi3", "vit"])
def test_residual_scale_needs_the_eps_update(arch, loaded, references):
    model = loaded[arch]
    spec = dataclasses.replace(model.spec, actions={**model.spec.actions, "norm.eps": []})
    g = {"residual.scale": torch.tensor(0.05, dtype=torch.float64)}  # a small scale: eps matters
    assert _changed(model, spec, g, arch, references) > 10


def test_olmo_clip_qkv_restricts_head_maps(loaded, references):
    model = loaded["olmo_clip"]
    assert "signed_permutation" in model.spec.groups["blocks.0.ov"].constraints
    free = dataclasses.replace(model.spec.groups["blocks.0.ov"], constraints=())
    g = {"blocks.0.ov": G.random_element(free, torch.Generator().manual_seed(8), spread=1.5)}
    assert _changed(model, model.spec, g, "olmo_clip", references) > 100
