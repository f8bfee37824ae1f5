"""The figures of the docs pages (`readme_figures.PAGES` after README.md): each measured number a page of
docs/ prints, as a `Figure` naming its page and the result cells it comes from, and each number there that
is no result, as a `NotFigure` with its reason. `readme_figures.py` adds them to its registry and checks
them as README.md's."""

from __future__ import annotations

from figure_refs import Figure, Mean, P, Ref, Sum, not_figures

LIMITATIONS, TWO_MODELS, MANY_MODELS = "docs/limitations.md", "docs/guides/two-models.md", "docs/guides/many-models.md"

# --- the result cells the pages quote -------------------------------------------------------------------

#: the six demo pairs of benchmarks/activation_diagnosis.py, by the name two-models.md gives them
ACTIVATION_PAIRS = {
    "ViTs on MNIST, seeds 0 and 1": "mnist-vit-demo-seed0 vs mnist-vit-demo-seed1",
    "ViTs on MNIST, seeds 2 and 3": "mnist-vit-demo-seed2 vs mnist-vit-demo-seed3",
    "character GPT-2s, seeds 0 and 1": "ts-char-gpt2-demo-seed0 vs ts-char-gpt2-demo-seed1",
    "Llama-style, characters, seeds 0 and 1": "ts-char-llama-demo-seed0 vs ts-char-llama-demo-seed1",
    "Llama-style, characters, seeds 2 and 3": "ts-char-llama-demo-seed2 vs ts-char-llama-demo-seed3",
    "GPT-NeoX, characters, seeds 0 and 1": "ts-char-neox-demo-seed0 vs ts-char-neox-demo-seed1",
}
#: the rows of an activation_diagnosis record that two-models.md's columns print, in their order
WEIGHT, ACTIVATION, GIVEN_ROTATION, BEST = ("weight matching |", "activation matching |",
                                            "weight matching given activation matching's residual rotation",
                                            "the default (--blocks best)")


def _activation(pair: str, row: str) -> Ref:
    """The test barrier of one element of one pair (`pair` as two-models.md names it)."""
    return Ref("activation_diagnosis", ACTIVATION_PAIRS[pair], row, "barrier")


def _short(pair: str) -> str:
    """A pair's short name: vit-0-1 for mnist-vit-demo-seed0 vs mnist-vit-demo-seed1."""
    a, b = ACTIVATION_PAIRS[pair].split(" vs ")
    return f"{a.split('-')[-3]}-{a[-1]}-{b[-1]}"


def _mean(row: str) -> Mean:
    return Mean(tuple(_activation(pair, row) for pair in ACTIVATION_PAIRS))


def _many(model: str) -> Ref:
    """The default dual's share of plain averaging's excess on four demo models."""
    return Ref("default_many", f"{model}-many", f"4 {model}", "default dual excess / simplex (ratio)", k=2)


def _many_minutes(model: str, key: str = "-many-epochs4-extend2") -> Sum:
    """The minutes a dual merge of four demo models took (record `{model}{key}`: the earlier default's by default)."""
    return _minutes("default_many", f"{model}{key}", f"4 {model}")


def _minutes(result: str, key: str, row: str) -> Sum:
    """The minutes a benchmark's dual run took: its timed parts (learning, validating, past the plan, rate search), in
    seconds, summed."""
    return Sum(tuple(Ref(result, key, row, "time: learning, validating, past the plan, rate search (s)", k=k)
                     for k in range(4)), scale=1 / 60)


#: the GPT-2 demo pair's default run (twelve epochs) and the run of the recipe before eight epochs, side by side on
#: one training
GPT2_E12, GPT2_E4 = "gpt2-char-demo", "gpt2-char-demo-epochs4-extend2-lam-samplinguniform-recomputeblock"


#: record key endings (`default_dual.Variant`): eight epochs, the default length before twelve; eight epochs with
#: uniform λ draws, the default before peak
E8, LAM_UNIFORM = "-epochs8", "-lam-samplinguniform"
UNIFORM = E8 + LAM_UNIFORM


def _epochs(pair: str) -> tuple[Ref, Ref]:
    """The dual's test barrier on a pair with uniform λ draws and the earlier length (`default_dual.py --epochs 4
    --extend 2 --lam-sampling uniform`), and with uniform λ draws and eight epochs."""
    return tuple(Ref("default_dual", key, key, "default dual") for key in (f"{pair}-epochs4-extend2{LAM_UNIFORM}",
                                                                          pair + UNIFORM))


def width_key(model: str, uniform: bool = False) -> str:
    """The default_many record of `model`'s x2 width pair (`default_many.py --part width`): the default's, or with
    `uniform` its run of eight epochs with uniform draws."""
    return f"{model}-width" + (UNIFORM if uniform else "")


def _width(model: str, column: str, uniform: bool = False) -> Ref:
    """A method's share of the bare expansion's barrier on a x2 width pair (record `width_key(model, uniform)`)."""
    return Ref("default_many", width_key(model, uniform), f"{model}:", column, k=1)


#: barrier_by_token.py's classes of input tokens: the common ones, and the two rarer
COMMON, RARER = "tokens covering 90% of training", ("the next 9%", "the rarest 1%")


def _token(pair: str, row: str, column: str) -> Ref:
    """A cell of barrier_by_token.py's record of `pair`."""
    return Ref("barrier_by_token", pair, row, column)


def _dual(pair: str) -> Ref:
    """The dual's share of plain averaging's test barrier on a demo pair: record `pair` (the pair's name for its default
    run, `+ E8` for eight epochs, `+ UNIFORM` for eight epochs with uniform λ draws)."""
    return Ref("default_dual", pair, pair, "dual / plain")


def _width_vit(row: str, column: str = "barrier") -> Ref:
    return Ref("width_weight_diagnosis", "mnist-vit-demo-seed0 into mnist-vit-wide-seed1", row, column)


def _spread(row: str, column: str, table: int = 0) -> Ref:
    return Ref("width_weight_spread", "into mnist-vit-wide-seed1", row, column, table=table)


#: the records of `default_dual.py NAME --start-from activation` and of the default start on the same trained pair
STARTS = tuple((f"{p}-startactivation", default) for p, default in (
    ("llama-char-demo", "llama-char-demo-retrained"), ("llama-wiki-char-demo", "llama-wiki-char-demo"),
    ("llama-mha-char-demo", "llama-mha-char-demo"), ("neox-rot100-char-demo", "neox-rot100-char-demo"),
    ("neox-rot50-char-demo", "neox-rot50-char-demo"), ("gpt2-char-demo", "gpt2-char-demo"),
    ("llama-char-demo-seeds23", "llama-char-demo-seeds23"), ("neox-wiki-char-demo", "neox-wiki-char-demo"),
    ("neox-char-demo", "neox-char-demo-retrained")))

MODELS = ("vit", "gpt2", "llama")
VIT01, LLAMA01 = "ViTs on MNIST, seeds 0 and 1", "Llama-style, characters, seeds 0 and 1"
ACT_DIAG, DEFAULT_MANY = "benchmarks/activation_diagnosis.py", "benchmarks/default_many.py"

# --- the figures, by page ---------------------------------------------------------------------------------

_FIGURES = [
    Figure("limitations-many", P("Dual matching leaves {} (ViT), {} (GPT-2) and {} (Llama) of plain averaging's excess "
                                 "on four demo models (the default,\n  retrained models), and {} (ViT), {} (GPT-2) and {} (Llama) of "
                                 "the bare expansion's"),
           "benchmark", refs=tuple(map(_many, MODELS)) + tuple(_width(m, "default dual (ratio)") for m in MODELS),
           command=DEFAULT_MANY, page=LIMITATIONS),
    Figure("limitations-many-epochs8", P("Eight epochs on the same four Llama-style models left {}."), "benchmark",
           refs=(Ref("default_many", "llama-many-epochs8-retrained", "4 llama", "default dual excess / simplex (ratio)",
                     k=2),), command=DEFAULT_MANY + " llama --part many --epochs 8", page=LIMITATIONS),
    Figure("limitations-many-start", P("Learning from their activation merge (`merge --start-from activation`) left {}."), "benchmark",
           refs=(Ref("default_many", "llama-many-startactivation", "4 llama", "default dual excess / simplex (ratio)",
                     k=2),), command=DEFAULT_MANY + " llama --part many --start-from activation", page=LIMITATIONS),
    Figure("limitations-width-weight", P("alone leaves {} of the bare expansion's barrier on the ViT width pair ({} on "
                                         "GPT-2's, {} on Llama's; {} on a retraining of the ViT pair;"), "benchmark",
           refs=tuple(_width(m, "weight (ratio)", uniform=True) for m in MODELS) + (_width("vit", "weight (ratio)"),),
           command=DEFAULT_MANY, page=LIMITATIONS),
    Figure("limitations-width-vit", P("(similarity {} against weight matching's {}) and leaves {}, and weight matching's "
                                      "own sweeps started from it raise the similarity and the barrier with it (to {} "
                                      "over every family; {} from the OV maps alone, {} from the residual rotation "
                                      "alone)"), "benchmark",
           refs=(_width_vit("the dual run's element", "weight similarity"),
                 _width_vit("weight matching |", "weight similarity"), _width_vit("the dual run's element"),
                 _width_vit("weight matching from the dual element: every default family"),
                 _width_vit("weight matching from the dual element: ov_map"),
                 _width_vit("weight matching from the dual element: residual_rotation")),
           command="benchmarks/width_weight_diagnosis.py", page=LIMITATIONS),
    Figure("limitations-width-control", P("keep {} of plain averaging's barrier after weight matching at "
                                          "their\n  own width and {} when both are "
                                          "first expanded into the wide config (padded "
                                          "units and head dimensions, the\n  expansion's reader and writer scales), where "
                                          "seed 0 into a model trained at that width keeps {}"), "benchmark",
           refs=tuple(Ref("width_weight_control", "mnist-vit-demo-seed0 and mnist-vit-demo-seed1 into mnist-vit-wide-seed1",
                          row, "weight / identity") for row in ("mnist-vit-demo-seed0 and mnist-vit-demo-seed1 |",
                                                                "mnist-vit-demo-seed0 and mnist-vit-demo-seed1, both",
                                                                "mnist-vit-demo-seed0 into")),
           command="benchmarks/width_weight_control.py", page=LIMITATIONS),
    Figure("limitations-width-spread", P("narrow seeds 1, 2 and 3 of the same recipe into the same wide model leave {}, "
                                         "{} and {} of the bare expansion's barrier, and weight matching of seed 0 from six "
                                         "random starting elements ends at lower objectives with barriers from {} to {} times"),
           "benchmark", refs=tuple(_spread(f"mnist-vit-demo-seed{k} |", "weight / bare") for k in (1, 2, 3))
           + tuple(_spread(f"random element, seed {k} |", "weight / bare", table=1) for k in (0, 2)),
           command="benchmarks/width_weight_spread.py", page=LIMITATIONS),
    Figure("limitations-memory", P("({} GiB for a {} GiB target:"), "benchmark",
           refs=(Ref("learned_memory", "cli", "align --method dual, pythia-1.4b-L24", "maximum RSS"),
                 Ref("learned_memory", "cli", "align --method dual, pythia-1.4b-L24", "target")),
           command="benchmarks/learned_memory.py", page=LIMITATIONS),
    Figure("two-models-weight-memory", P("the head tied; {} GB of bf16 endpoints together) `align --method weight` "
                                         "peaked at {} GB, and at {} GB with `--precision float32`"), "benchmark",
           refs=tuple(Ref("align_weight_memory", "gemma-3-1b-L2", p, c) for p, c in
                      (("float64", "endpoints"), ("float64", "peak RSS"), ("float32", "peak RSS"))),
           command="benchmarks/align_weight_memory.py --shape gemma-3-1b --layers 2", page=TWO_MODELS),
    Figure("limitations-blocks-activation", P("(e.g. ViT {} against {}, Llama {} against {})"), "benchmark",
           refs=(_activation(VIT01, ACTIVATION), _activation(VIT01, WEIGHT), _activation(LLAMA01, ACTIVATION),
                 _activation(LLAMA01, WEIGHT)), command=ACT_DIAG, page=LIMITATIONS),
    Figure("limitations-blocks-best", P("(mean {} against {}); on the first ViT pair the choice missed the lowest "
                                        "candidate ({} where {} was available, weight matching {})"), "benchmark",
           refs=(_mean(BEST), _mean(WEIGHT), _activation(VIT01, BEST), _activation(VIT01, GIVEN_ROTATION),
                 _activation(VIT01, WEIGHT)), command=ACT_DIAG, page=LIMITATIONS),
    Figure("limitations-rotary", P("the default leaves {} of plain averaging's barrier on the Llama demo pair ({} on "
                                   "the NeoX pair, 25% rotary; {} on GPT-2)"), "benchmark",
           refs=(_dual("llama-char-demo-retrained"), _dual("neox-char-demo-retrained"), _dual("gpt2-char-demo")),
           command="benchmarks/default_dual.py", page=LIMITATIONS),
    *(Figure(f"two-models-{_short(pair)}", P(f"| {pair} | {{}} | {{}} | {{}} | {{}} |"),
             "benchmark", refs=tuple(_activation(pair, row) for row in (WEIGHT, ACTIVATION, GIVEN_ROTATION, BEST)),
             command=ACT_DIAG, page=TWO_MODELS) for pair in ACTIVATION_PAIRS),
    Figure("two-models-blocks-best", P("(mean {} against {}); on the first ViT pair its choice on eight validation "
                                       "batches missed the lowest candidate ({})."), "benchmark",
           refs=(_mean(BEST), _mean(WEIGHT), _activation(VIT01, GIVEN_ROTATION)), command=ACT_DIAG, page=TWO_MODELS),
    Figure("limitations-rotary-trainings", P("it leaves {} (Llama; plain\n  averaging's barrier {}) and {} (NeoX, "
                                             "where the earlier training's default left {};"), "benchmark",
           refs=(_dual("llama-char-demo-training3"),
                 Ref("default_dual", "llama-char-demo-training3", "llama-char-demo-training3", "plain"),
                 _dual("neox-rot100-char-demo-training2"), _dual("neox-rot100-char-demo")),
           command="benchmarks/pairs.py NAME; benchmarks/default_dual.py NAME", page=LIMITATIONS),
    Figure("limitations-rotary-retrained", P("retraining of the Llama demo pair (plain averaging's barrier {} where the first "
                                             "training's is {}) it\n  leaves {}, and eight epochs instead of the default's twelve {};"),
           "benchmark", refs=(Ref("default_dual", "llama-char-demo-retrained", "llama-char-demo-retrained", "plain"),
                              Ref("default_dual", "llama-char-demo" + E8, "llama-char-demo" + E8, "plain"),
                              _dual("llama-char-demo-retrained"), _dual("llama-char-demo-epochs8-retrained")),
           command="benchmarks/default_dual.py llama-char-demo [--epochs 8]", page=LIMITATIONS),
    Figure("limitations-rotary-neox-retrained", P("on the retraining of the GPT-NeoX demo pair {}\n  and {}."), "benchmark",
           refs=(_dual("neox-char-demo-retrained"), _dual("neox-char-demo-epochs8-retrained")),
           command="benchmarks/default_dual.py neox-char-demo [--epochs 8]", page=LIMITATIONS),
    Figure("limitations-rotary-epochs12", P("too: {}\n  against {} (Llama-style, seeds 2 and 3), {} against {} (Llama-style "
                                            "without GQA), {} against\n  {} (NeoX, half of each head rotary), {} "
                                            "against {} (NeoX, the whole head) and {} against {}\n  (GPT-2 on "
                                            "WikiText-2), and kept {} on the NeoX pair a sixteenth rotary"), "benchmark",
           refs=tuple(_dual(p + e) for p in ("llama-char-demo-seeds23", "llama-mha-char-demo", "neox-rot50-char-demo",
                                              "neox-rot100-char-demo", "gpt2-wiki-char-demo") for e in ("", E8))
           + (_dual("neox-rot06-char-demo"),),
           command="benchmarks/default_dual.py NAME [--seeds 2,3] [--epochs 8]", page=LIMITATIONS),
    Figure("limitations-epochs12-cost", P("`--recompute auto` took {} min and left {} of plain averaging's barrier, where "
                                          "four epochs learning on up\n  to eight with uniform λ draws and `--recompute "
                                          "block` (the default before eight epochs) took {} min and left\n  {}."),
           "benchmark", refs=tuple(x for key in (GPT2_E12, GPT2_E4) for x in (_minutes("default_dual", key, key), _dual(key))),
           command="benchmarks/default_dual.py gpt2-char-demo [--epochs 4 --extend 2 --lam-sampling uniform --recompute "
                   "block]", page=LIMITATIONS),
    Figure("limitations-rotary-mha", P("with the\n  default's it leaves {} against {} and {} on the two GQA pairs"), "benchmark",
           refs=(_dual("llama-mha-char-demo"), _dual("llama-char-demo-seeds23"), _dual("llama-char-demo-retrained")),
           command="benchmarks/default_dual.py", page=LIMITATIONS),
    Figure("limitations-rotary-neox", P("GPT-NeoX pair with RoPE on the whole head leaves {}, where the\n  NeoX demo pair"),
           "benchmark", refs=(_dual("neox-rot100-char-demo"),), command="benchmarks/default_dual.py", page=LIMITATIONS),
    Figure("limitations-rotary-fraction", P("eight epochs of the default's λ draws leave {} (a sixteenth of each head "
                                            "rotary),\n  {} (a quarter), {} (half) and {} (the whole head) of plain "
                                            "averaging's barrier, and uniform λ\n  draws {}, {}, {} and {}."),
           "benchmark",
           refs=tuple(_dual(p + u) for u in (E8, UNIFORM) for p in ("neox-rot06-char-demo", "neox-char-demo",
                                                                    "neox-rot50-char-demo", "neox-rot100-char-demo")),
           command="benchmarks/default_dual.py NAME --epochs 8 [--lam-sampling uniform]", page=LIMITATIONS),
    Figure("limitations-unseen", P("plain averaging's barrier: {} (GPT-2),\n  {} (GPT-NeoX) and {} (Llama-style)"),
           "benchmark", refs=(_dual("gpt2-wiki-char-demo"), _dual("neox-wiki-char-demo"), _dual("llama-wiki-char-demo")),
           command="benchmarks/default_dual.py", page=LIMITATIONS),
    Figure("limitations-rotary-position", P("the default leaves {} (GPT-NeoX, the whole head rotary), {}\n  (Llama-style) "
                                            "and {} (Llama-style on WikiText-2) of plain averaging's excess at that "
                                            "position, against\n  {}, {} and {} over the whole window"), "benchmark",
           refs=tuple(Ref("barrier_by_position", k, row, "aligned / plain") for row in ("position 1", "all")
                      for k in ("neox-rot100-char-demo", "llama-char-demo-retrained", "llama-wiki-char-demo")),
           command="benchmarks/barrier_by_position.py", page=LIMITATIONS),
    Figure("limitations-unseen-tokens",
           P("stand at {}% of the test positions and carry {} (Llama-style),\n  {} (GPT-NeoX) and {} (GPT-2) of the "
             "aligned midpoint's excess"), "benchmark",
           refs=(Sum(tuple(_token("llama-wiki-char-demo", r, "share of positions") for r in RARER), scale=100),
                 *(Sum(tuple(_token(k, r, "share of the aligned excess") for r in RARER))
                   for k in ("llama-wiki-char-demo", "neox-wiki-char-demo", "gpt2-wiki-char-demo"))),
           command="benchmarks/barrier_by_token.py", page=LIMITATIONS),
    Figure("limitations-unseen-token-sign",
           P("below the endpoints' mean ({} and {} nats on the\n  Llama-style pair's two rarer classes), offsetting "
             "part of the common tokens' excess, and on WikiText-2 it is\n  above ({} and {}); on the common tokens "
             "alone the two GPT-2 pairs leave the same share of plain\n  averaging's excess, {} and {}"),
           "benchmark",
           refs=(*(_token(k, r, "aligned excess") for k in ("llama-char-demo-retrained", "llama-wiki-char-demo")
                   for r in RARER),
                 *(_token(k, COMMON, "aligned / plain") for k in ("gpt2-char-demo", "gpt2-wiki-char-demo"))),
           command="benchmarks/barrier_by_token.py", page=LIMITATIONS),
    Figure("limitations-families", P("the default leaves {} of plain\n  averaging's barrier on Phi-3 (Llama's group), "
                                     "{} on Qwen3"), "benchmark",
           refs=(_dual("phi3-char-demo"), _dual("qwen3-char-demo")), command="benchmarks/default_dual.py NAME",
           page=LIMITATIONS),
    Figure("limitations-families-moe", P("{} on Qwen3-MoE (Qwen3's attention, four experts) and {} on Qwen2-MoE"),
           "benchmark", refs=(_dual("qwen3moe-char-demo"), _dual("qwen2moe-char-demo")),
           command="benchmarks/default_dual.py qwen3moe-char-demo qwen2moe-char-demo", page=LIMITATIONS),
    Figure("limitations-families-olmo", P("and {} on OLMo (LayerNorm without weights"), "benchmark",
           refs=(_dual("olmo-char-demo"),), command="benchmarks/default_dual.py olmo-char-demo", page=LIMITATIONS),
    Figure("limitations-families-post-norm", P("the signed permutations, it leaves {} and\n  {} (records"), "benchmark",
           refs=(_dual("olmo2-char-demo"), _dual("gemma3-char-demo")), command="benchmarks/default_dual.py NAME",
           page=LIMITATIONS),
    Figure("limitations-families-post-norm-epochs24", P("epochs (`--epochs 24`) on a retraining of the OLMo-2 pair left {}"),
           "benchmark", refs=(_dual("olmo2-char-demo-epochs24"),),
           command="benchmarks/default_dual.py olmo2-char-demo --epochs 24", page=LIMITATIONS),
    Figure("limitations-unseen-epochs16", P("sixteen epochs on the Llama-style pair leave {} where twelve leave {}"),
           "benchmark", refs=(_dual("llama-wiki-char-demo-epochs16"), _dual("llama-wiki-char-demo")),
           command="benchmarks/default_dual.py llama-wiki-char-demo [--epochs 16]", page=LIMITATIONS),
    Figure("limitations-unseen-epochs12", P("(plain\n  averaging's barrier {} and {}, where the first trainings' are {} "
                                            "and {}, on which eight epochs\n  left {} (GPT-NeoX) and {} (Llama-style))"), "benchmark",
           refs=(*(Ref("default_dual", k, k, "plain") for k in ("neox-wiki-char-demo", "llama-wiki-char-demo",
                                                               "neox-wiki-char-demo" + E8, "llama-wiki-char-demo" + E8)),
                 _dual("neox-wiki-char-demo" + E8), _dual("llama-wiki-char-demo" + E8)),
           command="benchmarks/default_dual.py NAME [--epochs 8]", page=LIMITATIONS),
    Figure("limitations-epochs", P("lowered the test barrier from {} to {} and from {} to {} ({} of plain "
                                   "averaging's); on the Llama-style pair from {} to {},"), "benchmark",
           refs=(*_epochs("neox-wiki-char-demo"), *_epochs("gpt2-wiki-char-demo"),
                 _dual("gpt2-wiki-char-demo" + UNIFORM), *_epochs("llama-wiki-char-demo")),
           command="benchmarks/default_dual.py NAME --lam-sampling uniform [--epochs 4 --extend 2]", page=LIMITATIONS),
    Figure("limitations-start-activation",
           P("one training: {} against {} (Llama-style demo pair), {} against {}\n  (Llama-style on WikiText-2), {} "
             "against {} (Llama-style without grouped-query attention), {}\n  against {} (GPT-NeoX, the whole head "
             "rotary), {} against {} (half of each head) and {}\n  against {} (GPT-2 demo pair); it left {} against {} "
             "on the second Llama-style pair and {}\n  against {} on the GPT-NeoX pair on WikiText-2, {} against {} on the "
             "GPT-NeoX demo pair"),
           "benchmark", refs=tuple(ref for start, default in STARTS for ref in (_dual(start), _dual(default))),
           command="benchmarks/default_dual.py NAME [--start-from activation]", page=LIMITATIONS),
    Figure("limitations-start-training3", P("on one more training of the Llama-style demo pair it\n  left {} against {}"),
           "benchmark", refs=(_dual("llama-char-demo-training3-startactivation"), _dual("llama-char-demo-training3")),
           command="benchmarks/default_dual.py llama-char-demo [--start-from activation]", page=LIMITATIONS),
    Figure("limitations-start-vit", P("and {} and {} as the default's {} and {} on the MNIST and\n  Fashion-MNIST ViT "
                                      "pairs"), "benchmark",
           refs=(_dual("vit-demo-startactivation"), _dual("vit-fashion-demo-startactivation"), _dual("vit-demo"),
                 _dual("vit-fashion-demo")),
           command="benchmarks/default_dual.py vit-demo vit-fashion-demo [--start-from activation]", page=LIMITATIONS),
    Figure("limitations-start-validation", P("the second Llama-style\n  pair's start stood at {} against weight "
                                             "matching's {}"), "benchmark",
           refs=tuple(Ref("default_dual", key, key, "validation barrier: start -> best") for key in
                      ("llama-char-demo-seeds23-startactivation", "llama-char-demo-seeds23")),
           command="benchmarks/default_dual.py llama-char-demo --seeds 2,3 [--start-from activation]", page=LIMITATIONS),
    Figure("limitations-start-seed",
           P("spread: {} against {} on the Llama-style demo pair and {} against {} on the half-rotary\n  GPT-NeoX pair"),
           "benchmark", refs=tuple(_dual(f"{p}{s}-seed1") for p in ("llama-char-demo", "neox-rot50-char-demo")
                                   for s in ("-startactivation", "")),
           command="benchmarks/default_dual.py NAME --learn-seed 1 [--start-from activation]", page=LIMITATIONS),
    Figure("limitations-lr-scale",
           P("the QK maps at ten times the others' rate and at a tenth left {} and {} of plain averaging's barrier,\n"
             "  and every family but the residual rotation at a third of the rotation's rate and at three times it {} "
             "and\n  {} (`--lr auto`"), "benchmark",
           refs=tuple(_dual(f"llama-char-demo-lr-scale-{f}") for f in ("qk_map=10", "qk_map=0.1", "residual_rotation=3",
                                                                      "residual_rotation=0.3")),
           command="benchmarks/default_dual.py llama-char-demo --lr-scale FAMILY=FACTOR", page=LIMITATIONS),
    Figure("limitations-lr-scale-default", P("both), against the default's {} and {} at two learner seeds"), "benchmark",
           refs=(_dual("llama-char-demo-retrained"), _dual("llama-char-demo-seed1")),
           command="benchmarks/default_dual.py llama-char-demo [--learn-seed 1]", page=LIMITATIONS),
    Figure("limitations-lr-scale-neox", P("The QK maps at ten times the rate left {} and {} on the\n  GPT-NeoX pairs "
                                          "on WikiText-2 and half rotary, against the default's {} and {} (records"),
           "benchmark", refs=(*(_dual(f"{p}-lr-scale-qk_map=10") for p in ("neox-wiki-char-demo", "neox-rot50-char-demo")),
                              _dual("neox-wiki-char-demo"), _dual("neox-rot50-char-demo")),
           command="benchmarks/default_dual.py NAME [--lr-scale qk_map=10]", page=LIMITATIONS),
    Figure("limitations-batch", P("steps) left {} and {} (records"), "benchmark",
           refs=(_dual("llama-char-demo-batch8"), _dual("llama-char-demo-batch32")),
           command="benchmarks/default_dual.py llama-char-demo --batch-size B", page=LIMITATIONS),
    Figure("limitations-resolve",
           P("and by activation matching from {} to {} and {} nats on the Llama-style demo pair (learner seed 1),\n"
             "  from {} to {} and {} on the half-rotary GPT-NeoX pair (seed 1) and from {} to {} and {}\n  on the GPT-2"),
           "benchmark", refs=tuple(Ref("resolve_after_learning", key, key, col) for key in
                                   ("llama-char-demo-seed1", "neox-rot50-char-demo-seed1", "gpt2-char-demo-epochs12")
                                   for col in ("default dual", "weight re-solve: barrier", "activation re-solve: barrier")),
           command="benchmarks/resolve_after_learning.py NAME [--learn-seed 1 | --epochs 12]", page=LIMITATIONS),
    Figure("limitations-start-seed-neox",
           P("stayed so at\n  seeds 1 and 2, {} and {} against {} and {}, though the default's seeds there spread "
             "more\n  ({} to {})"), "benchmark",
           refs=(*(_dual(f"neox-char-demo{s}-seed{k}") for s in ("-startactivation", "") for k in (1, 2)),
                 _dual("neox-char-demo-retrained"), _dual("neox-char-demo-seed1")),
           command="benchmarks/default_dual.py neox-char-demo --learn-seed S [--start-from activation]", page=LIMITATIONS),
    Figure("learned-dual-peak", P("they left {} of plain averaging's test barrier on the GPT-NeoX demo pair, {} on the "
                                  "Llama-style one and {} on the GPT-2 one, where uniform draws leave {}, {} and {}"),
           "benchmark", refs=tuple(_dual(f"{p}-char-demo{u}") for u in (E8, UNIFORM) for p in ("neox", "llama", "gpt2")),
           command="benchmarks/default_dual.py NAME --epochs 8 [--lam-sampling uniform]", page="docs/guides/learned-dual.md"),
    Figure("learned-dual-peak-unseen", P("data no default was tuned on, {} against {} and {} against {}"), "benchmark",
           refs=tuple(_dual(p + u) for p in ("neox-wiki-char-demo", "llama-wiki-char-demo") for u in (E8, UNIFORM)),
           command="benchmarks/default_dual.py NAME --epochs 8 [--lam-sampling uniform]", page="docs/guides/learned-dual.md"),
    Figure("learned-dual-peak-rot50", P("of each head, both runs on one retraining, peak left {} against {}."), "benchmark",
           refs=(_dual("neox-rot50-char-demo" + E8), _dual("neox-rot50-char-demo" + UNIFORM)),
           command="benchmarks/default_dual.py neox-rot50-char-demo --epochs 8 [--lam-sampling uniform]",
           page="docs/guides/learned-dual.md"),
    Figure("learned-dual-peak-retrained", P("peak left {} against {} (a\n  second Llama-style pair), {} against {} (Llama-style "
                                            "without grouped-query attention), {} against {} (GPT-NeoX with RoPE on "
                                            "the whole head) and {} against {} (GPT-2 on WikiText-2)"), "benchmark",
           refs=tuple(ref for p in ("llama-char-demo-seeds23", "llama-mha-char-demo", "neox-rot100-char-demo",
                                    "gpt2-wiki-char-demo") for ref in (_dual(p + E8), _dual(p + UNIFORM))),
           command="benchmarks/default_dual.py NAME --epochs 8 [--lam-sampling uniform]", page="docs/guides/learned-dual.md"),
    Figure("learned-dual-peak-vit", P("(MNIST, Fashion-MNIST) {} and {}, as with uniform draws"), "benchmark",
           refs=(_dual("vit-demo" + E8), _dual("vit-fashion-demo" + E8)),
           command="benchmarks/default_dual.py NAME --epochs 8", page="docs/guides/learned-dual.md"),
    Figure("many-models-default", P("(width 128) the default left {} to {} of plain averaging's excess"), "benchmark",
           refs=(_many("vit"), _many("llama")), command=DEFAULT_MANY, page=MANY_MODELS),
    Figure("many-models-minutes-default", P("the default took {} to {} minutes"), "benchmark",
           refs=(_many_minutes("vit", "-many"), _many_minutes("gpt2", "-many")), command=DEFAULT_MANY, page=MANY_MODELS),
    Figure("many-models-minutes", P("(`--epochs 4 --extend 2`), took {} to {} minutes at one thread"), "benchmark",
           refs=(_many_minutes("vit"), _many_minutes("llama")), command=DEFAULT_MANY + " --epochs 4 --extend 2",
           page=MANY_MODELS),
]
FIGURES = {f.name: f for f in _FIGURES}

# --- the numbers that are no results, by page and reason --------------------------------------------------

NOT_FIGURES = not_figures({
    "a configuration (NeoX's rotary fraction)": ("25% rotary",),
    "targets (what the memory and step-cost measurements are held to)": (
        "within 1.3 x the endpoints + 1 GiB", "costs at most 1.2x a plain training step"),
    "a setting (the threshold of learning on, learn_config.FLAT)": ("still\n  gained over 0.001 nats",),
    "a setting (barrier_by_token.py's class of common tokens)": ("(those covering 90% of the training text)",),
}, page=LIMITATIONS) + not_figures({
    "settings (the validation size's target, the threshold of learning on, the validation split's share)": (
        "standard error is at most 0.002 nats", "lower than the one before by more than 0.001 nats",
        "(90-95% of its windows)"),
    "examples of the end line's wording": ('("after it rose to 0.031", "stayed within +0.001 over 4 evaluations"',),
    "a setting (recompute=auto's bound, blockwise.AUTO_KEEP_BYTES)": ("is at most 256 MiB for the batch",),
}, page="docs/guides/learned-dual.md") + not_figures({
    "a configuration (the device mesh of a test)": ("a 1-D and a 2 x 2 mesh",),
    "a tolerance (what the distributed tests hold a few steps to)": ("compare a few steps to 1e-5 relative",),
}, page="docs/guides/distributed.md") + not_figures({
    "a requirement (Python's version)": ("Python 3.11 or later",),
}, page="docs/getting-started.md") + not_figures({
    "names (Phi's model versions)": ("GPT-2, GPT-NeoX, Phi-1/1.5/2, StarCoder2", "## Phi-1, 1.5 and 2"),
}, page="docs/concepts/restrictions.md")
