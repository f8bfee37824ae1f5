"""Two checkpoints can be aligned only if they share a symmetry group: same architecture and sizes."""

from __future__ import annotations

from .. import SymmergeError

#: ModelShape fields that may differ (the epsilon moves with the residual scale; export unties the head)
FREE = ("eps", "tied")


def check_compatible(a, b, name_a: str = "A", name_b: str = "B") -> None:
    """Raise a SymmergeError naming the first mismatch between two loaded models."""
    sa, sb = a.shape.to_dict(), b.shape.to_dict()
    for key in sa:
        if key not in FREE and sa[key] != sb[key]:
            raise SymmergeError(
                f"{name_a} and {name_b} differ in {key} ({sa[key]} vs {sb[key]}); only checkpoints of the same "
                "architecture and sizes can be aligned"
            )
    ka, kb = set(a.params), set(b.params)
    if ka != kb:
        only = sorted(ka ^ kb)[0]
        where = name_a if only in ka else name_b
        raise SymmergeError(f"tensor {only} exists only in {where}; the checkpoints have different parameter sets")
