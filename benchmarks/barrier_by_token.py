"""Which tokens a language-model pair's barrier lives on: the midpoint's loss above the endpoints' mean, by how
common the input token is in the training split.

    PYTHONPATH=src python benchmarks/barrier_by_token.py KEY DATA A B ALIGNED_A ALIGNED_B [--batches 55]

A and B are a pair of stock checkpoints of one causal language model class as trained, ALIGNED_A and ALIGNED_B the
same pair aligned (the two outputs of `align --method dual`); each pair's midpoint is its canonical average, as
`symmerge barrier` makes it. The vocabulary is ranked by its count in the training split and cut into classes by
the share of training tokens they cover: the most common tokens that cover the first 90%, those covering the next
9%, and the rest (the rarest, 1% of the training text). On the test split's windows (those
`benchmarks/default_dual.py` measures its barrier on) every predicted position is put in the class of its input
token, and the record gives per class: its share of the test positions, the plain and the aligned pair's excess
(midpoint loss minus the endpoints' mean, per position), their ratio, and the class's share of the aligned pair's
total excess. Over all classes the excess is the barrier at λ = 1/2 that `symmerge barrier` reports.

What it shows: a token's embedding row is moved only by the residual rotation every token shares, so a rare
token, whose rows in the two models the learner sees few gradients for, can keep a larger excess after alignment.
Where the rare classes carry a larger share of the aligned excess than of the positions, the rows of rare tokens
are part of what alignment leaves. It measures the midpoint only.
"""

from __future__ import annotations

import argparse

import record
import torch
from midpoint_excess import excess

from symmerge.data.batches import load_batches
from symmerge.store.model import load_model

#: the classes' upper bounds on the cumulative share of training tokens, most common first
CLASSES = ((0.90, "tokens covering 90% of training"), (0.99, "the next 9%"), (1.0, "the rarest 1%"))


def token_classes(counts: torch.Tensor) -> torch.Tensor:
    """Each vocabulary id's class (an index into CLASSES) from its training count; ties in count keep id order."""
    order = torch.argsort(-counts.double(), stable=True)
    covered = torch.cumsum(counts[order].double(), 0) / counts.sum()
    before = covered - counts[order].double() / counts.sum()  # the share covered before this token
    cls = torch.empty_like(order)
    bounds = torch.tensor([b for b, _ in CLASSES], dtype=torch.float64)
    cls[order] = torch.searchsorted(bounds, before, right=True).clamp(max=len(CLASSES) - 1)
    return cls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("key", help="the record's name")
    ap.add_argument("data")
    ap.add_argument("models", nargs=4, metavar="MODEL", help="A B ALIGNED_A ALIGNED_B")
    ap.add_argument("--batches", type=int, default=55, help="test batches (default_dual.py's barrier reads 55)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--note", default="", help="appended to the record's notes")
    record.add_argument(ap, "barrier_by_token")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    batches = load_batches(args.models[0], args.data, "test", batch_size=args.batch_size, max_batches=args.batches)
    if "input_ids" not in batches[0]:
        raise SystemExit("barrier_by_token measures language models (batches of input_ids)")
    vocab = load_model(args.models[0]).shape.vocab
    counts = torch.zeros(vocab, dtype=torch.int64)
    for batch in load_batches(args.models[0], args.data, "train", batch_size=args.batch_size):
        counts += torch.bincount(batch["input_ids"].flatten(), minlength=vocab)
    cls = token_classes(counts)[torch.cat([b["input_ids"][:, :-1] for b in batches])]
    plain, aligned = (excess(*(load_model(m) for m in pair), batches)[0] for pair in (args.models[:2], args.models[2:]))
    rows = []
    for k, (_, name) in [*enumerate(CLASSES), (None, (None, "all"))]:
        at = torch.ones_like(cls, dtype=torch.bool) if k is None else cls == k
        p, a = plain[at].mean(), aligned[at].mean()
        rows.append([name, f"{at.double().mean():.4f}", f"{p:.4f}", f"{a:.4f}", f"{a / p:.3f}",
                     f"{aligned[at].sum() / aligned.sum():.3f}"])
    columns = ["input token", "share of positions", "plain excess", "aligned excess", "aligned / plain",
               "share of the aligned excess"]
    print("| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    notes = (f"nats per token on the test split ({len(batches)} batches of {args.batch_size} windows of "
             f"{batches[0]['input_ids'].shape[1]} tokens); classes by the input token's count in the training split "
             f"({int((counts > 0).sum())} of {vocab} ids occur there); excess: a midpoint's loss minus the mean of "
             "its endpoints'")
    record.save(args.results, "barrier_by_token", args.key, f"{args.key}: the midpoint's excess by input token",
                [record.table(args.key, columns, rows)], notes + (f"; {args.note}" if args.note else ""))


if __name__ == "__main__":
    main()
