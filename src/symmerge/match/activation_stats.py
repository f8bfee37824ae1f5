"""Sufficient statistics of streaming activation matching (`activation_stream.py`), each giving what the
in-memory path (`activation.py`) computes from stored activations, up to rounding.

- `FfnMoments`: count, means, centred co-moments and sums of squares of two sets of hidden units,
  merged batch by batch with the pairwise update of Chan, Golub and LeVeque (stable where the one-pass
  `sum x y - n mean_x mean_y` cancels); `correlation()` is `activation._corr` and the units' RMS.
- `sides_factor`: the data a head-map solver is fed, from a second moment instead of tokens. Every
  map solver reads its data only through Grams within a pair of sides (`solvers.py`), and a side is
  `W~ x~` with `x~ = [x; 1]`, so the pair's Gram is `[W~a M_aa W~a^T, W~a M_ab W~b^T; ., W~b M_bb W~b^T]`;
  any `F` with `F F^T` equal to it (here `U sqrt(L)` from its eigendecomposition) is data with the
  same Grams, `2 dh` columns instead of the tokens.
"""

from __future__ import annotations

import torch

from ..algebra import groups as G


class FfnMoments:
    """Moments of hidden units `ha [tokens, n_A]`, `hb [tokens, n_B]`, batch by batch, in their precision."""

    def __init__(self):
        self.n = 0

    def add(self, ha: torch.Tensor, hb: torch.Tensor) -> None:
        k = ha.shape[0]
        if k == 0:
            return
        ma, mb = ha.mean(0), hb.mean(0)
        ca, cb = ha - ma, hb - mb
        c, va, vb = ca.T @ cb, (ca * ca).sum(0), (cb * cb).sum(0)
        sa, sb = (ha * ha).sum(0), (hb * hb).sum(0)
        if self.n == 0:
            self.n, self.ma, self.mb, self.c, self.va, self.vb, self.sa, self.sb = k, ma, mb, c, va, vb, sa, sb
            return
        n = self.n + k
        da, db, f = ma - self.ma, mb - self.mb, self.n * k / n
        self.c += c + f * torch.outer(da, db)
        self.va += va + f * da * da
        self.vb += vb + f * db * db
        self.ma, self.mb = self.ma + da * (k / n), self.mb + db * (k / n)
        self.sa, self.sb, self.n = self.sa + sa, self.sb + sb, n

    def correlation(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(correlation `[n_A, n_B]` as `activation._corr` gives it, RMS of A's units, RMS of B's)."""
        n = self.n
        std = lambda v: (v / (n - 1)).sqrt().clamp_min(1e-12)  # noqa: E731  (unbiased, as Tensor.std)
        corr = self.c / (std(self.va)[:, None] * std(self.vb)[None, :]) / max(n - 1, 1)
        rms = lambda s: (s.to(G.DTYPE) / n).sqrt().clamp_min(1e-300)  # noqa: E731
        return corr, rms(self.sa), rms(self.sb)


def sides_factor(wa: torch.Tensor, wb: torch.Tensor, moment: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Data `(Xa, Xb)`, each `[kv, dh, 2 dh]`, whose Grams within the pair are those of the sides
    `W~a x~_A` and `W~b x~_B` over the tokens (see the module docstring).

    `wa`, `wb`: `[kv, (q,) dh, d + 1]` (B's KV groups and query heads already in A's order; the query
    heads' columns are summed over, as `activation._flat_q` lays them side by side); `moment`:
    `sum [x~_A; x~_B][x~_A; x~_B]^T`, `[2 (d + 1), 2 (d + 1)]`."""
    wa = (wa if wa.dim() == 4 else wa.unsqueeze(1)).to(moment.dtype)
    wb = (wb if wb.dim() == 4 else wb.unsqueeze(1)).to(moment.dtype)
    e = wa.shape[-1]
    blocks = {}
    for (i, x), (j, y) in (((0, wa), (0, wa)), ((0, wa), (1, wb)), ((1, wb), (1, wb))):
        t = x @ moment[i * e:(i + 1) * e, j * e:(j + 1) * e]  # [kv, q, dh, d + 1]
        blocks[i, j] = torch.einsum("kqie,kqje->kij", t, y)  # [kv, dh, dh]
    gram = torch.cat([torch.cat([blocks[0, 0], blocks[0, 1]], -1),
                      torch.cat([blocks[0, 1].transpose(-1, -2), blocks[1, 1]], -1)], -2)  # [kv, 2 dh, 2 dh]
    gram = (gram + gram.transpose(-1, -2)) / 2
    lam, u = torch.linalg.eigh(gram.to(G.DTYPE))
    f = u * lam.clamp_min(0).sqrt().unsqueeze(-2)  # F F^T = gram
    dh = wa.shape[-2]
    return f[:, :dh, :], f[:, dh:, :]
