"""Where along the window a language-model pair's barrier lives: the midpoint's loss above the endpoints' mean,
position by position.

    PYTHONPATH=src python benchmarks/barrier_by_position.py KEY DATA A B ALIGNED_A ALIGNED_B [--batches 55]

A and B are a pair of stock checkpoints of one causal language model class as trained, ALIGNED_A and
ALIGNED_B the same pair aligned (the two outputs of `align --method dual`, or A and the aligned B); each
pair's midpoint is its canonical average, as `symmerge barrier` and `interpolate` make it. On the test
split's windows (the batches `benchmarks/default_dual.py` measures its barrier on) it records, per
position in the window, the midpoint's mean loss minus the mean of the endpoints' (the excess), for the
plain and the aligned pair and their ratio, for the first position, the next seven, and the rest; over
all positions the excess is the barrier at λ = 1/2 that `symmerge barrier` reports.

What it shows: at the first position of a window a causal model attends to one key, so its attention
scores (the QK circuit, and RoPE's rotation with it) cannot change its output there; from the second
position on they can. An aligned excess at the first position comes from the rest of the network
(embeddings, the values and outputs, the FFN, the norms). Alignment leaves every endpoint's function as
it was, so the endpoints' mean loss is the same for both pairs (the plain pair's is printed). It
measures the midpoint only, where the paths of these pairs peak; a path peaking elsewhere is not
described by it.
"""

from __future__ import annotations

import argparse

import record
import torch
from midpoint_excess import excess

from symmerge.data.batches import load_batches
from symmerge.store.model import load_model

#: the window's positions as printed: the first (one key), the next seven, the rest
SPANS = ((0, 1, "position 1"), (1, 8, "positions 2-8"), (8, None, "positions 9-"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("key", help="the record's name")
    ap.add_argument("data")
    ap.add_argument("models", nargs=4, metavar="MODEL", help="A B ALIGNED_A ALIGNED_B")
    ap.add_argument("--batches", type=int, default=55, help="test batches (default_dual.py's barrier reads 55)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--note", default="", help="appended to the record's notes")
    record.add_argument(ap, "barrier_by_position")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    batches = load_batches(args.models[0], args.data, "test", batch_size=args.batch_size, max_batches=args.batches)
    if "input_ids" not in batches[0]:
        raise SystemExit("barrier_by_position measures language models (batches of input_ids)")
    (plain, ends), (aligned, _) = (tuple(t.mean(0) for t in excess(*(load_model(m) for m in pair), batches))
                                   for pair in (args.models[:2], args.models[2:]))
    rows = [[name, f"{plain[lo:hi].mean():.4f}", f"{aligned[lo:hi].mean():.4f}",
             f"{aligned[lo:hi].mean() / plain[lo:hi].mean():.3f}", f"{ends[lo:hi].mean():.4f}"]
            for lo, hi, name in (*SPANS, (0, None, "all"))]
    columns = ["positions", "plain excess", "aligned excess", "aligned / plain", "endpoints' mean loss"]
    print("| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    notes = (f"nats per token on the test split ({len(batches)} batches of {args.batch_size} windows of "
             f"{batches[0]['input_ids'].shape[1]} tokens); excess: a midpoint's mean loss minus the mean of its endpoints'")
    record.save(args.results, "barrier_by_position", args.key, f"{args.key}: the midpoint's excess by position",
                [record.table(args.key, columns, rows)], notes + (f"; {args.note}" if args.note else ""))


if __name__ == "__main__":
    main()
