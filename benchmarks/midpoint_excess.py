"""A language-model pair's midpoint excess at every predicted position: the loss of the canonical average of A and
B (as `symmerge barrier` and `interpolate` form it) minus the mean of the endpoints' losses, token by token.

The pair's barrier at λ = 1/2 is this excess's mean. `barrier_by_position.py` averages it per position in the
window and `barrier_by_token.py` per class of input token; both take the command line, the test batches and the
record written here (`parse_args`, `test_batches`, `pair_excesses`, `report`)."""

from __future__ import annotations

import argparse

import record
import torch

from symmerge.data.batches import load_batches
from symmerge.evaluation.forward import StockForward, interpolate
from symmerge.store.model import load_model


def parse_args(name: str, description: str) -> argparse.Namespace:
    """The command line of benchmark `name`: KEY DATA A B ALIGNED_A ALIGNED_B and the test batches' size."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("key", help="the record's name")
    ap.add_argument("data")
    ap.add_argument("models", nargs=4, metavar="MODEL", help="A B ALIGNED_A ALIGNED_B")
    ap.add_argument("--batches", type=int, default=55, help="test batches (default_dual.py's barrier reads 55)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--note", default="", help="appended to the record's notes")
    record.add_argument(ap, name)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    return args


def test_batches(args: argparse.Namespace, name: str) -> list[dict]:
    """The test split's batches `default_dual.py` measures its barrier on; a language model's only."""
    batches = load_batches(args.models[0], args.data, "test", batch_size=args.batch_size, max_batches=args.batches)
    if "input_ids" not in batches[0]:
        raise SystemExit(f"{name} measures language models (batches of input_ids)")
    return batches


def token_losses(forward: StockForward, params: dict, batches: list[dict]) -> torch.Tensor:
    """Next-token loss of every predicted position of `batches` (float64, [windows, T - 1])."""
    out = []
    with torch.no_grad():
        for batch in batches:
            ids = batch["input_ids"]
            logits = forward.forward(params, batch, labels=False).logits[:, :-1].double()
            out.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none"))
    return torch.cat(out)


def excess(a, b, batches: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the midpoint's loss minus the endpoints' mean, the endpoints' mean) at every predicted position of
    `batches` ([windows, T - 1] each), for models `a` and `b` of one class."""
    forward = StockForward(a)
    ends = (token_losses(forward, a.params, batches) + token_losses(forward, b.params, batches)) / 2
    return token_losses(forward, interpolate(a.params, b.params, 0.5), batches) - ends, ends


def pair_excesses(args: argparse.Namespace, batches: list[dict]):
    """`excess` of the plain pair (A, B) and of the aligned pair, each pair loaded only while it runs."""
    return (excess(*(load_model(m) for m in pair), batches) for pair in (args.models[:2], args.models[2:]))


def report(args: argparse.Namespace, name: str, title: str, columns: list[str], rows: list[list[str]],
           batches: list[dict], notes: str) -> None:
    """Print the table and save it as record `args.key` of benchmark `name` (notes after the batches' size)."""
    print("| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    size = (f"nats per token on the test split ({len(batches)} batches of {args.batch_size} windows of "
            f"{batches[0]['input_ids'].shape[1]} tokens); {notes}")
    record.save(args.results, name, args.key, f"{args.key}: {title}", [record.table(args.key, columns, rows)],
                size + (f"; {args.note}" if args.note else ""))
