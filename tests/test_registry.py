"""The matcher registry, the options classes and the JSON report schema: one set of defaults, read by the
CLI, the library configuration and the demo; every report stamped the same way. No model is trained here."""

from __future__ import annotations

import dataclasses
import json

import pytest

from factories import ARCHS, make_config
from symmerge import SymmergeError, __version__
from symmerge.adapters import adapter_for
from symmerge.algebra.spec import build_spec
from symmerge.cli import build_parser
from symmerge.commands.option_flags import option_fields, users
from symmerge.match import options as opt
from symmerge.match import registry
from symmerge.match.learn_config import DEFAULT_LR, EPOCHS, RECIPES, LearnConfig
from symmerge.store.report import SCHEMA_VERSION, dumps, stamped


def test_align_parser_defaults_are_the_options_defaults():
    """Every option's argparse default is its options class's (None where it differs by method or recipe,
    filled in by `Options.resolved`; --recipe: the default recipe); `options_for` gives learned/dual the full
    recipe (the `LearnConfig` defaults), or the quick one, and activation matching its own data defaults."""
    args = build_parser().parse_args(["align", "a", "b", "-o", "out"])
    for name, f in option_fields().items():
        per = {registry.get(m).options().default_for(name, r) for m in users(name) for r in RECIPES}
        expected = (opt.DEFAULT_RECIPE if name == "recipe" else
                    f.default if len(per) == 1 and not any(registry.get(m).options.__dataclass_fields__[name]
                                                           .metadata["recipe"] for m in users(name)) else None)
        assert getattr(args, name) == expected, name
    fields = {"steps": "steps", "epochs": "epochs", "lr": "lr", "lam_range": "lam_range",
              "val_points": "grid_points", "eval_every": "eval_every", "val_batches": "val_batches"}
    for method in ("learned", "dual"):
        opts = registry.options_for(method, vars(args))
        assert opts["recipe"] == "full" and opts["lr"] == "auto" and opts["max_batches"] is None
        for name, field in fields.items():
            assert opts[name] == getattr(LearnConfig(method=method), field), name
        assert opts["max_iters"] == opt.WeightOptions().max_iters  # the weight matching it starts from
        quick = registry.options_for(method, {"recipe": "quick"})
        assert quick["lr"] == DEFAULT_LR[method] and quick["steps"] == RECIPES["quick"]["steps"] == 200
        assert (quick["batch_size"], quick["max_batches"], quick["epochs"]) == (8, 8, None)
        many = registry.many_options_for(method)  # merge's: the same recipe, and the rounds' options
        assert many["recipe"] == opt.DEFAULT_RECIPE == "full" and many["lr"] == "auto" and many["epochs"] == EPOCHS
        assert registry.many_options_for(method, {"recipe": "quick"})["steps"] == 200
    assert {k: registry.options_for("activation", vars(args))[k] for k in ("batch_size", "max_batches")} == {
        "batch_size": 8, "max_batches": 8}
    given = build_parser().parse_args(["align", "a", "b", "-o", "out", "--lr", "0.3", "--lam-range", "0.2,0.7"])
    opts = registry.options_for("dual", vars(given))
    assert opts["lr"] == 0.3 and opts["lam_range"] == (0.2, 0.7)
    assert registry.options_for("dual", opt.DualOptions(lr=0.3, lam_range=(0.2, 0.7))) == opts  # typed, the same


def test_an_explicit_length_drops_the_recipes_other():
    """--steps replaces the full recipe's epochs, --epochs the quick recipe's steps; both at once is refused."""
    assert registry.options_for("dual", {"steps": 50})["epochs"] is None
    opts = registry.options_for("dual", {"recipe": "quick", "epochs": 2.0})
    assert (opts["steps"], opts["epochs"]) == (None, 2.0)
    with pytest.raises(SymmergeError, match="give one of them"):
        opt.DualOptions(steps=5, epochs=2.0)


@pytest.mark.parametrize("cls, given, why", [
    (opt.WeightOptions, {"max_iters": 0}, "at least 1"),
    (opt.WeightOptions, {"max_iters": 2.5}, "not a whole number"),
    (opt.WeightOptions, {"precision": "float16"}, "choose from float64, float32"),
    (opt.WeightOptions, {"sweep_workers": True}, "not a int"),
    (opt.ActivationOptions, {"batch_size": 0}, "at least 1"),
    (opt.LearnedOptions, {"lr": -1.0}, "above 0"),
    (opt.LearnedOptions, {"lam_range": (0.9, 0.1)}, "0 <= low <= high <= 1"),
    (opt.LearnedOptions, {"lam_range": 0.5}, "not a tuple"),
    (opt.DualOptions, {"val_points": 2}, "at least 3"),
    (opt.DualOptions, {"recipe": "slow"}, "choose from full, quick"),
    (opt.ManyOptions, {"order_seed": -1}, "not a seed"),
])
def test_options_are_checked_once_when_made(cls, given, why):
    """Each options class refuses a bad value on one line naming the class and field; the defaults, None
    (the default) and a list where a tuple belongs are taken (negative controls)."""
    with pytest.raises(SymmergeError, match=why) as e:
        cls(**given)
    assert "\n" not in str(e.value)  # per field: "Class(field=value): why"; across fields: the CLI's words
    name = next(iter(given))
    assert getattr(cls(**{name: None}), name) == getattr(cls(), name)
    assert opt.LearnedOptions(lam_range=[0.2, 0.7]).lam_range == (0.2, 0.7)


def test_learn_config_takes_the_method_learning_rate():
    assert LearnConfig(method="learned").lr == "auto"  # the full recipe
    assert LearnConfig(method="learned", lr=None).lr == DEFAULT_LR["learned"]
    assert LearnConfig(method="dual", lr=None).lr == DEFAULT_LR["dual"] != DEFAULT_LR["learned"]
    assert LearnConfig(method="dual", lr=0.1).lr == 0.1


def test_every_matcher_is_complete():
    """Each matcher has an options class (its start's options among them); one that starts from another
    starts from a registered one that needs no more data than it does; an unknown name is refused."""
    for m in registry.MATCHERS.values():
        assert issubclass(m.options, opt.Options) and m.options.METHOD == m.name
        if m.starts_from:
            start = registry.get(m.starts_from)
            assert not start.needs_data or m.needs_data
            assert issubclass(m.options, start.options)
        assert not m.validates or m.needs_data
    with pytest.raises(SymmergeError, match="unknown method"):
        registry.get("nope")


@pytest.mark.parametrize("arch", ARCHS)
def test_default_families_are_all_but_the_residual_scale(arch):
    config = make_config(arch)
    spec = build_spec(adapter_for(config).shape(config))
    assert spec.default_families() == [f for f in spec.families() if f != "residual_scale"]
    assert "residual_rotation" in spec.default_families()


@pytest.mark.parametrize("arch", ARCHS)
def test_role_queries_name_each_group_once(arch):
    """The spec's role queries, checked against the families and structure the groups carry: every block
    group has exactly one role, optional roles exist exactly when the shape has them (GQA, gated MLP, experts, a
    shared expert)."""
    config = make_config(arch)
    spec = build_spec(adapter_for(config).shape(config))
    s = spec.shape
    family = {"heads": "head_perm", "query_heads": "head_perm", "qk": "qk_map", "ov": "ov_map", "ffn": "ffn_perm",
              "glu": "glu_scale", "experts": "expert_perm", "shared": "ffn_perm", "shared_glu": "glu_scale"}
    for i in range(s.n_layers):
        roles = spec.layer_roles(i)
        named = {role: n for role, n in vars(roles).items() if n is not None}
        assert sorted(named.values()) == sorted(n for n, g in spec.groups.items() if g.layer == i)
        assert all(spec.groups[n].family == family[role] for role, n in named.items())
        assert not spec.groups[roles.heads].batch
        assert (roles.query_heads is not None) == (s.q_per_kv > 1) and (roles.glu is not None) == s.gated
        assert roles.head_maps == (roles.qk, roles.ov)
        assert roles.head_permutations == tuple(n for n in (roles.heads, roles.query_heads) if n)
        assert [n for n in named.values() if spec.in_head_circuit(n)] == [*roles.head_permutations, *roles.head_maps]
        assert [n for n in named.values() if spec.is_head_permutation(n)] == list(roles.head_permutations)
        assert (roles.experts is not None) == s.experts_in(i)
        assert (roles.shared is not None) == (roles.shared_glu is not None) == (s.experts_in(i) and s.d_shared > 0)
        assert [n for n in named.values() if spec.is_expert_permutation(n)] == [n for n in [roles.experts] if n]
    scale = [n for n, g in spec.groups.items() if g.family == "residual_scale"]
    assert spec.residual_scales(spec.groups) == scale and len(scale) == int(s.residual_scale)
    assert spec.includes_residual_scale(spec.select(None)) == s.residual_scale
    assert not spec.includes_residual_scale(spec.select(spec.default_families()))
    assert not any(spec.in_head_circuit(n) or spec.is_head_permutation(n) for n, g in spec.groups.items() if g.layer is None)


def test_reports_are_stamped():
    """The stamps come first and the payload's keys follow unchanged; a payload may not redefine a stamp."""
    payload = {"method": "weight", "objective": [0.5, 0.75]}
    rep = json.loads(dumps("align", payload))
    assert list(rep)[:3] == ["schema_version", "command", "symmerge_version"]
    assert rep["schema_version"] == SCHEMA_VERSION and rep["command"] == "align" and rep["symmerge_version"] == __version__
    assert {k: rep[k] for k in payload} == payload
    with pytest.raises(SymmergeError, match="schema"):
        stamped("align", {"command": "x"})


@pytest.mark.parametrize("model_type, cls", [
    ("gpt2", "GPT2LMHeadModel"), ("gpt_neox", "GPTNeoXForCausalLM"), ("llama", "LlamaForCausalLM"),
    ("mistral", "MistralForCausalLM"), ("qwen2", "Qwen2ForCausalLM"), ("olmo", "OlmoForCausalLM"),
    ("olmo3", "Olmo3ForCausalLM"), ("vit", "ViTForImageClassification"),
])
def test_config_without_architectures_is_read_by_model_type(model_type, cls):
    from transformers import AutoConfig

    from symmerge.adapters import ADAPTERS

    config = AutoConfig.for_model(model_type)
    config.architectures = None
    assert adapter_for(config) is ADAPTERS[cls]


@pytest.mark.parametrize("arch", ["qwen2", "mistral", "smollm3", "gemma2", "gemma3"])
def test_a_folder_without_architectures_is_read_and_written_as_its_own_class(tmp_path, arch):
    """An adapter serving several classes (Llama's, Gemma 2/3's) reads which one a config without `architectures`
    is from its model_type: the canonical tensors run through that class give the saved model's logits, and a
    written copy names it. Negative control: another class of the adapter run on the same tensors gives other
    logits (Qwen2's biases, Gemma 3's QK-norm and windows are dropped or misread)."""
    from checks import precision, tolerance
    from factories import example_inputs, logits, make_model, save_model, stock_logits
    from symmerge.store.model import load_model
    from symmerge.store.model import save_model as write

    stock = make_model(arch)
    folder = save_model(stock, tmp_path / "in")
    config = json.loads((folder / "config.json").read_text())
    cls = config.pop("architectures")[0]
    (folder / "config.json").write_text(json.dumps(config))
    model = load_model(folder)
    assert model.shape.hf_class == cls
    inputs = example_inputs(arch)
    reference = logits(stock, inputs)
    tol = tolerance(precision(stock), reference)  # Gemma's norms compute in float32
    assert (stock_logits(model, model.params, inputs) - reference).abs().max() < tol
    write(model, model.params, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == [cls]
    other = next(c for c in model.adapter.hf_classes if c != cls)
    try:
        wrong = stock_logits(dataclasses.replace(model, shape=dataclasses.replace(model.shape, hf_class=other)),
                             model.params, inputs)
    except (SymmergeError, AttributeError, KeyError):  # the other class cannot even take these tensors or this config
        return  # (Qwen2's biases, Gemma 3's QK-norm weights, Mistral's and Gemma 3's config keys): as good a control
    assert (wrong - reference).abs().max() > 100 * tol


def test_config_without_architectures_of_a_refused_class_says_why():
    from transformers import AutoConfig

    config = AutoConfig.for_model("bert")
    config.architectures = None
    with pytest.raises(SymmergeError, match="post-norm"):
        adapter_for(config)
    config = AutoConfig.for_model("bloom")  # a class symmerge has no adapter for: refused by name
    config.architectures = None
    with pytest.raises(SymmergeError, match="not supported"):
        adapter_for(config)


def test_phi_with_a_qk_layernorm_is_refused_with_what_is_supported():
    """A LayerNorm over each head's q and k (Phi's `qk_layernorm`) leaves no QK map but the identity and needs its
    own canonical tensors: refused, naming the setting that is supported; the factory's Phi (False) is read."""
    from factories import make_config

    config = make_config("phi")
    assert adapter_for(config).shape(config).arch == "phi"  # the control: the same config without it
    config.qk_layernorm = True
    with pytest.raises(SymmergeError, match="qk_layernorm=True .* qk_layernorm=False"):
        adapter_for(config).shape(config)
