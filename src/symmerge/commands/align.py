"""`symmerge align A B -o OUT --method weight|activation|learned|dual`: re-parameterise B to match A.

weight / activation / learned: OUT is B re-parameterised (B's class, B's function, A's coordinates).
dual: OUT/A and OUT/B, each its input re-parameterised, so that the straight line between them is low-loss.
"""

from __future__ import annotations

from pathlib import Path

from .. import SymmergeError, devices, distributed
from ..match import registry
from ..match.learn_config import BATCH_TOKENS, RECIPES
from ..report import write as write_report
from ..spec import FAMILIES
from . import out_dtype
from .checks import check_report_file
from .help_sections import DATA, DEVICE, LEARNED, MATCHING, Sections, output_section, section_of
from .transform import parse_groups


def register(sub) -> None:
    p = sub.add_parser("align", help="find the symmetry that brings B closest to A; OUT is B re-parameterised")
    p.add_argument("a", help="target checkpoint folder or Hub id ORG/NAME[@REVISION] (never modified)")
    p.add_argument("b", help="checkpoint folder or Hub id ORG/NAME[@REVISION] to align (never modified)")
    output_section(p, "output folder: B's class, B's function, A's coordinates",
                   "write the report (objective per iteration, groups found) here", "replace a non-empty OUT")
    sections = Sections(p)
    how = sections.get(MATCHING)
    how.add_argument("--method", choices=list(registry.MATCHERS), default="weight",
                     help="; ".join(f"{m.name}: {m.help}" for m in registry.MATCHERS.values()))
    how.add_argument("--groups", default=None,
                     help=f"comma-separated families, or 'all' (default: all but residual_scale). Families: {','.join(FAMILIES)}")
    data = sections.get(DATA)
    data.add_argument("--data", default=None, help="data set: a .txt file, an IDX folder, 'digits', hf:NAME (symmerge.data)")
    data.add_argument("--split", default="train", help="activation matching's split (learned/dual: train and validation)")
    data.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the model's context)")
    for opt in registry.OPTIONS.values():
        add_option(sections.get(section_of(opt.name)), opt, opt.help)
    learn = sections.get(LEARNED)
    learn.add_argument("--resume", action="store_true", help="continue the interrupted run of OUT")
    learn.add_argument("--shard-endpoints", type=int, nargs="?", const=0, default=None, metavar="K",
                       help="under torchrun: FSDP2 shards the frozen endpoints, each process keeping 1/N of them (1/K "
                       "with K: over groups of K processes, replicated across groups; K divides N)")
    devices.add_arguments(sections.get(DEVICE), "learned/dual's forward and weight matching's products",
                          dtype_help="working precision of the forward (default: the checkpoint's own dtype)")
    p.set_defaults(run=run, checkpoints=("a", "b"), spreads=lambda args: registry.get(args.method).validates)  # over torchrun's processes


def forward_methods() -> list[str]:
    return [m.name for m in registry.MATCHERS.values() if m.forward]


def placed_methods() -> list[str]:
    return [m.name for m in registry.MATCHERS.values() if m.places]


def add_option(p, opt, text: str | None = None, recipes: tuple[str, ...] = tuple(RECIPES)) -> None:
    """One matcher option, with the registry's default: shown by the help formatter, or, where it differs
    by method or recipe (None here: the registry fills it in, `options_for`), named per method in the help.
    `text`: the help (default: the methods that use it, then the registry's help); `recipes`: the recipes
    whose defaults the help shows (merge runs one)."""
    users = registry.users(opt.name)
    text = f"{'/'.join(users)}: {opt.help}" if text is None else text
    default, shown = opt.default, ""
    if isinstance(default, (dict, registry.FromRecipe)):
        texts: dict[str, list[str]] = {}  # the value's text -> the methods it is the default of
        for m in users:
            texts.setdefault(_shown(opt, m, recipes), []).append(m)
        default = None
        shown = " (default: " + (next(iter(texts)) if len(texts) == 1 else
                                 "; ".join(f"{'/'.join(ms)}: {t}" for t, ms in texts.items())) + ")"
    elif isinstance(default, tuple):  # as typed on the command line; argparse parses it with opt.type
        default = ",".join(f"{x:g}" for x in default)
    kw = {"type": opt.type} if opt.type else {}
    if opt.choices:
        kw["choices"] = opt.choices
    p.add_argument(opt.flag, default=default, help=f"{text}{shown}", **kw)


def _shown(opt, method: str, recipes: tuple[str, ...]) -> str:
    """`method`'s default: `value`, or for a recipe's value `X (full), Y (quick)`."""
    per = {r: opt.default_for(method, r) for r in recipes}
    if len(set(map(_text, per.values()))) == 1:
        return _text(per[recipes[0]])
    return ", ".join(f"{_text(v)} ({r})" for r, v in per.items())


def _text(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(f"{x:g}" for x in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def load_data(args, model_dir, split: str, batch_size: int, max_batches: int | None) -> list[dict]:
    """Batches for the data-driven methods, through the project's data API."""
    from ..data import load_batches

    if not args.data:
        raise SymmergeError(f"--method {args.method} needs --data PATH (a data set to run both models on)")
    return load_batches(model_dir, args.data, split, batch_size, args.seq_len, max_batches)


def tokens_per_item(model_dir, seq_len: int | None) -> int:
    """Tokens one sequence (--seq-len, or the context) or one image (its patches and CLS token) holds."""
    from ..data import context_length, is_vision
    from ..io import load_config

    config = load_config(Path(model_dir))
    if is_vision(config):
        return (int(config.image_size) // int(config.patch_size)) ** 2 + 1
    return seq_len or context_length(config)


def batch_size(args, opts) -> int:
    """--batch-size, or for the full recipe as many items as make BATCH_TOKENS tokens."""
    if opts["batch_size"] is not None:
        return opts["batch_size"]
    return max(1, round(BATCH_TOKENS / tokens_per_item(args.a, args.seq_len)))


def _data(args, matcher, opts) -> registry.Data | None:
    """learned/dual: training batches and validation batches; activation: batches of --split."""
    if not matcher.needs_data:
        return None
    if opts["batch_size"] is not None and opts["batch_size"] < 1:
        raise SymmergeError(f"--batch-size must be at least 1, got {opts['batch_size']}")
    if opts["max_batches"] is not None and opts["max_batches"] < 1:
        raise SymmergeError(f"--max-batches must be at least 1, got {opts['max_batches']}")
    size = batch_size(args, opts)
    if matcher.validates:
        val = opts["val_batches"] if isinstance(opts["val_batches"], int) else None  # auto: sized from all
        return registry.Data(load_data(args, args.a, "train", size, opts["max_batches"]),
                             load_data(args, args.a, "validation", size, val))
    return registry.Data(load_data(args, args.a, args.split, size, opts["max_batches"]))


def _load_pair(args, families, lazy_dtype=None):
    """Both checkpoints (in memory, or lazily for a streaming matcher), checked to share a group."""
    from ..expand import widest
    from ..model import LazyModel, load_model

    if lazy_dtype is None:
        a, b = load_model(args.a), load_model(args.b)
    else:
        a, b = LazyModel(args.a, lazy_dtype), LazyModel(args.b, lazy_dtype)
    a, b = widest(a, b, str(args.a), str(args.b))  # mixed widths: the narrower expanded into the wider
    b.spec.select(families)  # unknown or absent families fail here, before any work
    return a, b


def _meta(rep: dict, data: str | None) -> dict:
    """The output's record of the alignment (symmerge.json, and its model card)."""
    source = {"data": data} if data else {}
    return {"align": {**{k: rep[k] for k in ("method", "a", "b", "groups_selected", "objective")}, **source}}


def align_streamed(args, matcher, families, opts, place):
    """A streaming matcher (weight, activation) from the checkpoints, one block at a time, and OUT written block
    by block."""
    import torch

    from ..apply import apply
    from ..stream import write_streaming

    data = _data(args, matcher, opts)
    a, b = _load_pair(args, families, getattr(torch, opts["precision"]))
    runtime = {"device": place.device} if matcher.places else {}
    result = registry.align(matcher.name, a, b, families, data, opts=opts, progress=True, **runtime)
    rep = report(args, b, result, families)
    if matcher.places:
        rep["device"] = str(place.device)
    g = result.elements["B"]
    dtype = out_dtype.resolve(args) or b.dtype
    gauge, side = in_gauge_of(args.a, args.out, dtype, a, rep)
    write_streaming(b, lambda part: apply(b.spec, g, part), args.out, force=args.force, extra=_meta(rep, args.data),
                    gauge=gauge, side=side, dtype=dtype)
    return rep


def in_gauge_of(a, out, dtype, like, rep: dict):
    """(gauge of A, side files) for an aligned output OUT: written in A's norm gauge, with a mergekit
    config of the midpoint beside it; (None, {}) where A's gauge cannot be used (see `gauge.Gauge.of`), or
    where A was expanded into B's wider config (`like`, A as matched, is not of A's shape): OUT is then in
    canonical form, the gauge `symmerge expand A --like B` writes A in. `rep["gauge"]` says which."""
    from ..gauge import mergekit_base, side_files
    from ..model import reference_gauge

    gauge = reference_gauge(a, like)
    if gauge is None:
        rep["gauge"] = "canonical"
        return None, {}
    rep["gauge"] = str(a)
    return gauge, side_files([a, out], mergekit_base(a, out), dtype)


def align_in_memory(args, matcher, families, opts, place):
    """A matcher of B alone on models in memory (activation): OUT = g·B."""
    from ..match.outputs import write_element

    data = _data(args, matcher, opts)
    a, b = _load_pair(args, families)
    result = registry.align(matcher.name, a, b, families, data, opts, progress=True)
    rep = report(args, b, result, families)
    dtype = out_dtype.resolve(args) or b.dtype
    gauge, side = in_gauge_of(args.a, args.out, dtype, a, rep)
    write_element(b, result.elements["B"], args.out, force=args.force, extra=_meta(rep, args.data), gauge=gauge,
                  side=side, dtype=dtype)
    return rep


def report(args, b, result, families) -> dict:
    from ..match.summary import summarize

    found = summarize(b.spec, result.elements["B"], b.spec.select(families))
    return {
        "method": result.method, "a": str(args.a), "b": str(args.b), "out": str(args.out),
        "groups_selected": families or b.spec.families(),
        "objective_name": "similarity = 1 - ||A - g.B||^2 / ||A||^2 over canonical tensors"
        + (" (activation matching: before and after; it optimises the activations' fit)" if result.method == "activation" else ""),
        **result.figures, **found,
    }


def run(args) -> int:
    matcher = registry.get(args.method)
    if matcher.validates:  # under torchrun every process checks, and all share the first error
        group = distributed.init(args.device, shard=args.shard_endpoints)
        place, opts, families = group.agree(lambda: _checked(args, matcher))
        return run_learned(args, matcher, families, opts, place)
    place, opts, families = _checked(args, matcher)
    rep = (align_streamed if matcher.streams else align_in_memory)(args, matcher, families, opts, place)
    if args.json:
        write_report(args.json, "align", rep)
    print(f"wrote {args.out}: {args.b} aligned to {args.a} by {args.method} matching; similarity "
          f"{rep['objective'][0]:.6f} -> {rep['objective'][-1]:.6f} in {rep['iterations']} iterations ({rep['seconds']:.1f}s)")
    return 0


def _checked(args, matcher):
    """(placement, the matcher's options, the families), every argument checked before any work."""
    from ..io import prepare_output

    place = devices.resolve(args)
    if not matcher.forward and args.dtype:
        raise SymmergeError(f"--dtype is for --method {' or '.join(forward_methods())} (the forward's precision); "
                            f"{args.method} matching computes in --precision")
    if not matcher.forward and not matcher.places and args.device:
        raise SymmergeError(f"--device is for --method {' or '.join([*forward_methods(), *placed_methods()])}; "
                            f"{args.method} matching runs on the CPU")
    if args.resume and not matcher.forward:
        raise SymmergeError(f"--resume continues an interrupted --method {' or '.join(forward_methods())} run; "
                            f"{args.method} matching keeps no run to resume: run it again without --resume")
    opts = registry.options_for(matcher.name, vars(args))
    if not args.resume:
        prepare_output(args.out, args.force, [args.a, args.b])  # fail before any work
    if matcher.needs_data and not args.data:
        raise SymmergeError(f"--method {args.method} needs --data PATH (a data set to run both models on)")
    if args.max_iters < 1:
        raise SymmergeError(f"--max-iters must be at least 1, got {args.max_iters}")
    check_report_file(args.json, "--json", [args.out])
    families = default_families(args)
    registry.check(matcher.name, families, opts)
    return place, opts, families


def default_families(args) -> list[str] | None:
    """--groups as given; without it, the spec's default families (`Spec.default_families` says why)."""
    if args.groups is not None:
        return parse_groups(args.groups)
    from ..model import LazyModel

    return LazyModel(args.b).spec.default_families()


def _affordable_rate(args, matcher, families, opts, data) -> str | None:
    """Before any work: `--lr auto` asked for on a run too short for its search is refused; the
    recipe's `auto` on such a run (a tiny data set) becomes the method's fixed rate, and the note
    returned says so (it goes into the report and the end-of-run line)."""
    from ..match.learn_config import DEFAULT_LR
    from ..match.lr_search import check_budget, size_ratio

    try:
        check_budget(registry.learn_config(matcher.name, families, opts, progress=False), len(data.train),
                     len(data.val), size_ratio(data.train, data.val))
    except SymmergeError:
        if args.lr is not None:
            raise
        opts["lr"] = DEFAULT_LR[matcher.name]
        return f"lr {opts['lr']:g}, the method's fixed rate: this run is too short for --lr auto's search"
    return None


def run_learned(args, matcher, families, opts, place) -> int:
    """Learn against the loss on the path, from the solution of the matcher it starts from (weight
    matching, absorbed into B); OUT = g·B, or OUT/A and OUT/B for dual.

    Bounded memory: A and B are `LazyModel`s (safetensors memory-mapped, read one part at a time) from the
    start to the end. Weight matching streams them in --precision; the learner keeps them frozen in their
    own dtype (`blockwise.Frozen`) and materialises one block (one chunk of the head, the batch's rows of
    the embedding) at a time; OUT is written part by part (`stream.write_streaming`); the output check reads
    the files block by block (`file_forward.FileForward`). No whole float32/float64 copy of either model is
    ever made (tests/test_outputs_bounded.py)."""
    import torch

    from ..match.learn_loop import Result
    from ..match.outputs import checkpoint_folder, finish_learned, open_checkpoint

    group = distributed.current()  # several processes: each reads the inputs, rank 0 alone writes
    precision = getattr(torch, opts["precision"])
    data, (a, b) = group.agree(lambda: (_data(args, matcher, opts), _load_pair(args, families, precision)))
    group.agree(lambda: group.check_data(data.train, data.val))  # before weight matching, which comes first
    note = group.agree(lambda: _affordable_rate(args, matcher, families, opts, data))
    group.agree(lambda: open_checkpoint(args.out, args.force, args.resume), main_only=True)
    ckpt = checkpoint_folder(args.out)
    result = registry.align(matcher.name, a, b, families, data, opts, progress=group.main, checkpoint=ckpt,
                            resume=args.resume, **place.record(place.working(a.dtype)))
    if not group.main:
        return 0
    rep = finish_learned(Result(result.elements, {**result.figures, "data": args.data}), a, b, args.out, args.force, data.val[0], ckpt,
                         dtype=out_dtype.resolve(args))
    start = result.start.figures
    rep["weight_matching"] = {"objective": start["objective"], "seconds": start["seconds"]}
    rep["recipe"] = opts["recipe"]
    if note:
        rep["lr_note"] = note
    if args.json:
        write_report(args.json, "align", rep)
    gaps = ", ".join(f"{o['output']}: {o['max_logit_diff']:.2e}" for o in rep["outputs"])
    print(f"wrote {args.out}: {args.method} matching, {rep['end_line']}{f' ({note})' if note else ''}; "
          f"largest logit change {gaps}")
    return 0
