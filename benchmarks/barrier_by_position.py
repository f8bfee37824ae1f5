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

from midpoint_excess import pair_excesses, parse_args, report, test_batches

#: the window's positions as printed: the first (one key), the next seven, the rest
SPANS = ((0, 1, "position 1"), (1, 8, "positions 2-8"), (8, None, "positions 9-"))


def main() -> None:
    args = parse_args("barrier_by_position", __doc__.splitlines()[0])
    batches = test_batches(args, "barrier_by_position")
    (plain, ends), (aligned, _) = (tuple(t.mean(0) for t in pair) for pair in pair_excesses(args, batches))
    rows = [[name, f"{plain[lo:hi].mean():.4f}", f"{aligned[lo:hi].mean():.4f}",
             f"{aligned[lo:hi].mean() / plain[lo:hi].mean():.3f}", f"{ends[lo:hi].mean():.4f}"]
            for lo, hi, name in (*SPANS, (0, None, "all"))]
    columns = ["positions", "plain excess", "aligned excess", "aligned / plain", "endpoints' mean loss"]
    report(args, "barrier_by_position", "the midpoint's excess by position", columns, rows, batches,
           "excess: a midpoint's mean loss minus the mean of its endpoints'")


if __name__ == "__main__":
    main()
