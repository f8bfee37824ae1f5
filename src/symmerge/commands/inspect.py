"""`symmerge inspect MODEL`: architecture, shape, symmetry groups and parameter count."""

from __future__ import annotations

from ..store.report import describe, dumps


def register(sub) -> None:
    p = sub.add_parser("inspect", help="print the architecture, shape and symmetry group of a checkpoint")
    p.add_argument("model", help="Hugging Face checkpoint folder or Hub id ORG/NAME[@REVISION]")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(run=run, checkpoints=("model",))


def run(args) -> int:
    from ..store.model import LazyModel

    info = describe(LazyModel(args.model))
    if args.json:
        print(dumps("inspect", info))
        return 0
    print(f"{info['path']}: {info['hf_class']} ({info['arch']}), {info['parameters']:,} parameters")
    print("shape: " + ", ".join(f"{k}={v}" for k, v in info["shape"].items() if k not in ("arch", "hf_class")))
    print(f"{'group':<22} {'kind':<12} {'size':>6} {'copies':>7} {'dimension':>10}  constraint / why")
    for fam in info["families"]:
        print(f"{fam['family']:<22} {fam['kind']:<12} {fam['size']:>6} {fam['copies']:>7} {fam['dimension']:>10}  "
              f"{', '.join(fam['constraints']) or '-'}: {fam['note']}")
    print(f"total continuous dimension: {info['group_dimension']:,}")
    for note in info["notes"]:
        print(f"note: {note}")
    return 0
