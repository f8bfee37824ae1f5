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

from pathlib import Path

import torch
from midpoint_excess import pair_excesses, parse_args, report, test_batches

from symmerge.data.batches import load_batches
from symmerge.store.io import load_config

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
    args = parse_args("barrier_by_token", __doc__.splitlines()[0])
    batches = test_batches(args, "barrier_by_token")
    vocab = int(load_config(Path(args.models[0])).vocab_size)
    counts = torch.zeros(vocab, dtype=torch.int64)
    for batch in load_batches(args.models[0], args.data, "train", batch_size=args.batch_size):
        counts += torch.bincount(batch["input_ids"].flatten(), minlength=vocab)
    cls = token_classes(counts)[torch.cat([b["input_ids"][:, :-1] for b in batches])]
    plain, aligned = (pair[0] for pair in pair_excesses(args, batches))
    rows = []
    for k, (_, name) in [*enumerate(CLASSES), (None, (None, "all"))]:
        at = torch.ones_like(cls, dtype=torch.bool) if k is None else cls == k
        p, a = plain[at].mean(), aligned[at].mean()
        rows.append([name, f"{at.double().mean():.4f}", f"{p:.4f}", f"{a:.4f}", f"{a / p:.3f}",
                     f"{aligned[at].sum() / aligned.sum():.3f}"])
    columns = ["input token", "share of positions", "plain excess", "aligned excess", "aligned / plain",
               "share of the aligned excess"]
    report(args, "barrier_by_token", "the midpoint's excess by input token", columns, rows, batches,
           f"classes by the input token's count in the training split ({int((counts > 0).sum())} of {vocab} ids "
           "occur there); excess: a midpoint's loss minus the mean of its endpoints'")


if __name__ == "__main__":
    main()
