"""Parameterisations: unconstrained tensors -> elements of one continuous group, differentiably.

Every parameterisation is a pair of pure functions over a `raw` dict (trainable, float64) and a
`fixed` dict (chosen once, never trained, e.g. a sign matrix):

    element(raw, fixed) -> g          stays in the group for *every* value of raw
    from_element(g) -> (raw, fixed)   a right inverse: element(*from_element(g)) == g

| method       | orthogonal groups                          | invertible groups                          |
|--------------|--------------------------------------------|--------------------------------------------|
| cayley       | Q = (I + A)^{-1} (I - A), A skew           | (not admitted)                             |
| cayley-signs | Q = D (I + A)^{-1} (I - A), D fixed ±1     | (not admitted)                             |
| expm         | Q = exp(A), A skew (det +1)                | M = exp(X) (det > 0)                       |
| polar        | (not admitted)                             | M = Q L L^T, Q cayley-signs, L lower       |
|              |                                            | triangular with positive diagonal exp(.)   |
| direct       | (not admitted)                             | M = X (the inverse is solved for by apply) |

Diagonal and scalar groups are log-parameterised (`d = sign * exp(x)`, the sign fixed: a scale
cannot cross zero continuously). Constraints stay satisfied by construction: "fixes_ones" rotations
are `11^T/n + U R U^T` with R parameterised in O(n-1); "rope" maps get a log-polar scaled rotation
`exp(rho) (cos phi, sin phi)` per rotary pair and the method on the free block. Discrete groups
(permutations, "signed_permutation") have no parameterisation: learned matching keeps them fixed
or, for permutations, uses a straight-through estimator.

Why cayley-signs: Cayley reaches only rotations without eigenvalue -1 (so never a reflection);
every orthogonal Q is D·Cayley(A) for some ±1 diagonal D, found greedily by keeping
det(I + D Q) away from zero (Sherman-Morrison updates, O(n^3) in all).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import torch

from ..algebra import groups as G
from ..errors import SymmergeError

METHODS = ("cayley", "cayley-signs", "expm", "polar", "direct")
#: the methods `--param` may choose per kind (read from the kind objects; "auto" is `Kind.default_param`)
ADMITS = {k: s.admits for (k, c), s in G.STRUCTURES.items() if not c and s.param_choice}
DTYPE = G.DTYPE

Raw = dict[str, torch.Tensor]


def _eye(m: int) -> torch.Tensor:
    return torch.eye(m, dtype=DTYPE)


def _skew(a: torch.Tensor) -> torch.Tensor:
    """The skew-symmetric matrix whose strict upper triangle is that of `a` (the rest is ignored)."""
    u = torch.triu(a, 1)
    return u - u.transpose(-1, -2)


def _cayley(a: torch.Tensor) -> torch.Tensor:
    s = _skew(a)
    eye = _eye(a.shape[-1])
    return torch.linalg.solve(eye + s, eye - s)


def _cayley_inverse(q: torch.Tensor, what: str) -> torch.Tensor:
    """The skew A with Cayley(A) = q; q must have no eigenvalue -1."""
    eye = _eye(q.shape[-1])
    if q.shape[-1] and float(torch.linalg.cond(eye + q).max()) > 1e10:
        raise SymmergeError(f"cayley cannot represent this element of {what} (it has eigenvalue -1, e.g. a "
                            "reflection); use --param cayley-signs")
    return torch.triu(torch.linalg.solve(eye + q, eye - q), 1)


def greedy_signs(q: torch.Tensor) -> torch.Tensor:
    """±1 vector d with det(I + diag(d) q) far from 0, so that diag(d) q is a Cayley image.

    det(I + diag(d) q) is affine in each d_k, and equals 1 with every d_k = 0. Fixing d_k one at a
    time to the sign that does not shrink |det| (matrix determinant lemma: the factor is
    1 + d_k (M^{-1})[:, k]·q_k) keeps it >= 1; M^{-1} follows by Sherman-Morrison.
    """
    if q.dim() > 2:
        return torch.stack([greedy_signs(x) for x in q.reshape(-1, *q.shape[-2:])]).reshape(q.shape[:-1])
    m = q.shape[-1]
    minv = _eye(m)
    d = torch.zeros(m, dtype=DTYPE)
    for k in range(m):
        beta = float(q[k] @ minv[:, k])
        s = 1.0 if beta >= 0 else -1.0
        d[k] = s
        u = minv[:, k] * s  # M^{-1} e_k s
        minv = minv - torch.outer(u, q[k] @ minv) / (1.0 + s * beta)
    return d


def _real_log(m: torch.Tensor, what: str, method: str) -> torch.Tensor:
    """A real matrix logarithm of each `[n, n]` matrix (batched), or a SymmergeError."""
    flat = m.detach().cpu().reshape(-1, *m.shape[-2:]).numpy()  # scipy's logm: on the host, whatever m's device
    logs = []
    for x in flat:
        if x.shape[-1] and np.linalg.det(x) <= 0:
            raise SymmergeError(f"{method} reaches only elements of {what} with positive determinant; "
                                "use cayley-signs (orthogonal) or polar/direct (invertible)")
        lg = scipy.linalg.logm(x) if x.shape[-1] else x
        if np.iscomplexobj(lg):
            if np.abs(lg.imag).max() > 1e-8 * max(1.0, np.abs(lg).max()):
                raise SymmergeError(f"this element of {what} has no real logarithm; use polar or direct")
            lg = lg.real
        logs.append(lg)
    return torch.as_tensor(np.stack(logs), dtype=DTYPE, device=m.device).reshape(m.shape)


# --- orthogonal cores (size m, any batch) ------------------------------------------------------------


def _orth_element(method: str, raw: Raw, fixed: Raw) -> torch.Tensor:
    if method == "expm":
        return torch.linalg.matrix_exp(_skew(raw["A"]))
    q = _cayley(raw["A"])
    return fixed["signs"].unsqueeze(-1) * q if method == "cayley-signs" else q


def _orth_from(method: str, q: torch.Tensor, what: str) -> tuple[Raw, Raw]:
    if method == "expm":
        return {"A": torch.triu(_real_log(q, what, method), 1)}, {}
    if method == "cayley-signs":
        d = greedy_signs(q)
        return {"A": _cayley_inverse(d.unsqueeze(-1) * q, what)}, {"signs": d}
    return {"A": _cayley_inverse(q, what)}, {}


# --- invertible cores ---------------------------------------------------------------------------------


def _lower(x: torch.Tensor) -> torch.Tensor:
    """Lower triangular with positive diagonal exp(diag x): a Cholesky factor for every x."""
    return torch.tril(x, -1) + torch.diag_embed(torch.exp(torch.diagonal(x, dim1=-2, dim2=-1)))


def _inv_element(method: str, raw: Raw, fixed: Raw) -> torch.Tensor:
    if method == "expm":
        return torch.linalg.matrix_exp(raw["X"])
    if method == "direct":
        return raw["X"]
    low = _lower(raw["L"])
    return _orth_element("cayley-signs", {"A": raw["A"]}, fixed) @ (low @ low.transpose(-1, -2))


def _inv_from(method: str, m: torch.Tensor, what: str) -> tuple[Raw, Raw]:
    if method == "expm":
        return {"X": _real_log(m, what, method)}, {}
    if method == "direct":
        return {"X": m.clone()}, {}
    u, s, vh = torch.linalg.svd(m)  # m = (u vh)(vh^T s vh): orthogonal times positive definite
    v = vh.transpose(-1, -2)
    raw, fixed = _orth_from("cayley-signs", u @ vh, what)
    chol = torch.linalg.cholesky((v * s.unsqueeze(-2)) @ vh)
    raw["L"] = torch.tril(chol, -1) + torch.diag_embed(torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)))
    return raw, fixed


def _prefixed(d: Raw, prefix: str) -> Raw:
    return {prefix + k: v for k, v in d.items()}


def _unprefixed(d: Raw, prefix: str) -> Raw:
    return {k[len(prefix):]: v for k, v in d.items() if k.startswith(prefix)}


class _Form:
    """One parameterisation form (`kinds.Kind.param_form`): `element` and its right inverse `from_element`."""

    def __init__(self, group: G.Group, method: str):
        self.group, self.method = group, method


class _ScalarForm(_Form):  # a = exp(log)
    def element(self, raw: Raw, fixed: Raw) -> torch.Tensor:
        return torch.exp(raw["log"])

    def from_element(self, x: torch.Tensor) -> tuple[Raw, Raw]:
        return {"log": torch.log(_nonzero(x, self.group).abs())}, {}


class _DiagonalForm(_Form):  # d = sign * exp(log), the sign fixed
    def element(self, raw, fixed):
        return fixed["sign"] * torch.exp(raw["log"])

    def from_element(self, x):
        return {"log": torch.log(_nonzero(x, self.group).abs())}, {"sign": torch.sign(x)}


def _nonzero(x: torch.Tensor, group: G.Group) -> torch.Tensor:
    if bool((x == 0).any()):
        raise SymmergeError(f"element of {group.name} has a zero scale: it is not invertible")
    return x


class _OrthogonalForm(_Form):
    def element(self, raw, fixed):
        return _orth_element(self.method, raw, fixed)

    def from_element(self, x):
        return _orth_from(self.method, x, self.group.name)


class _OrthogonalFixingOnesForm(_Form):
    """O = 11^T/n + U R U^T (kinds.orthogonal_fixing_ones), R parameterised in O(n-1), U computed once, not per step."""

    def __init__(self, group, method):
        super().__init__(group, method)
        n = group.size
        self._mean, self._u = torch.full((n, n), 1.0 / n, dtype=DTYPE), G.ones_complement_basis(n)

    def element(self, raw, fixed):
        return self._mean + self._u @ _orth_element(self.method, raw, fixed) @ self._u.T

    def from_element(self, x):
        return _orth_from(self.method, self._u.T @ x @ self._u, self.group.name)  # R in O(n-1)


class _InvertibleForm(_Form):
    def element(self, raw, fixed):
        return _inv_element(self.method, raw, fixed)

    def from_element(self, x):
        return _inv_from(self.method, x, self.group.name)


class _RopeForm(_Form):
    """A log-polar scaled rotation exp(rho) (cos phi, sin phi) per rotary pair, the method on the free block."""

    def element(self, raw, fixed):
        g = self.group
        rho, phi = raw["pairs"].unbind(-1)
        rad = torch.exp(rho)
        free = (_inv_element(self.method, _unprefixed(raw, "free."), _unprefixed(fixed, "free."))
                if g.size > g.rotary_dims else torch.zeros(*g.batch, 0, 0, dtype=DTYPE))
        return g.pairing.blocks(g.size, rad * torch.cos(phi), rad * torch.sin(phi), free)

    def from_element(self, x):
        g = self.group
        a, b = g.pairing.pairs(x)
        raw = {"pairs": torch.stack([torch.log(torch.hypot(a, b)), torch.atan2(b, a)], -1)}
        if g.size == g.rotary_dims:
            return raw, {}
        fr, ff = _inv_from(self.method, g.pairing.free(x), g.name)
        return {**raw, **_prefixed(fr, "free.")}, _prefixed(ff, "free.")


FORMS = {"scalar": _ScalarForm, "diagonal": _DiagonalForm, "orthogonal": _OrthogonalForm,
         "orthogonal_fixing_ones": _OrthogonalFixingOnesForm, "invertible": _InvertibleForm, "rope": _RopeForm}


class Parametrization:
    """The parameterisation `method` of one continuous group, in the form its kind names (module docstring)."""

    def __init__(self, group: G.Group, method: str):
        self.group, self.method = group, method
        self._form = FORMS[group.structure.param_form](group, method)

    def element(self, raw: Raw, fixed: Raw) -> torch.Tensor:
        return self._form.element(raw, fixed)

    def from_element(self, x: torch.Tensor) -> tuple[Raw, Raw]:
        """Raw and fixed tensors whose element is `x` (which must be a member of the group)."""
        return self._form.from_element(x.to(DTYPE))

    def identity(self) -> tuple[Raw, Raw]:
        """Raw tensors whose element is exactly the identity: zeros (signs +1), the free matrix I for direct.
        (`from_element(I)` is equal only up to rounding: the polar form goes through an SVD.)"""
        raw, fixed = self.from_element(G.identity(self.group))
        raw = {k: (v if self.method == "direct" and k.endswith("X") else torch.zeros_like(v)) for k, v in raw.items()}
        return raw, {k: torch.ones_like(v) for k, v in fixed.items()}


def learnable(group: G.Group) -> bool:
    """Continuous groups are parameterised; permutations and (signed) permutation matrices are discrete."""
    return not group.discrete


def straight_through(group: G.Group) -> bool:
    """Permutations, as index vectors or as permutation matrices, are learned by a straight-through
    estimator; signed permutations (clip_qkv) stay fixed."""
    return group.structure.straight_through


def parametrization(group: G.Group, method: str) -> Parametrization:
    """The parameterisation of `group` by `method` ("log" for scales), or a SymmergeError saying why not."""
    if not learnable(group):
        raise SymmergeError(f"{group.name} is discrete ({group.order_note}): it has no parameterisation and is kept fixed")
    kind = group.structure
    if not kind.param_choice:
        return Parametrization(group, kind.default_param)
    if method not in METHODS:
        raise SymmergeError(f"unknown parameterisation {method!r}; choose from {', '.join(METHODS)}")
    if method not in kind.admits:
        raise SymmergeError(
            f"parameterisation {method} does not keep {group.name} ({group.kind}) in its group; "
            f"{group.kind} groups admit {', '.join(kind.admits)}"
        )
    return Parametrization(group, method)


def _per_family(groups: dict[str, G.Group], text: str) -> tuple[dict[str, str], str]:
    """`--param` as (method per named family, default for the others)."""
    if "=" not in text:
        return {}, text
    per_family: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        fam, _, meth = item.partition("=")
        per_family[fam.strip()] = meth.strip()
    unknown = [f for f in per_family if not any(g.family == f for g in groups.values())]
    if unknown:
        raise SymmergeError(f"--param names families {unknown} that are not being learned")
    return per_family, "auto"


def resolve_methods(groups: dict[str, G.Group], text: str | None) -> dict[str, str]:
    """Method per learnable group from `--param`: "auto", one method for every matrix group, or
    "family=method,..." (families not named use auto). A method some group does not admit is an error."""
    per_family, default = _per_family(groups, (text or "auto").strip())
    out = {}
    bad = []
    for name, g in groups.items():
        if not learnable(g):
            continue
        kind = g.structure
        if not kind.param_choice:
            out[name] = kind.default_param
            continue
        meth = per_family.get(g.family, default)
        meth = kind.default_param if meth == "auto" else meth
        if meth not in METHODS:
            raise SymmergeError(f"unknown parameterisation {meth!r}; choose from auto, {', '.join(METHODS)}")
        if meth not in kind.admits:
            bad.append((g, meth))
        out[name] = meth
    if bad:
        g, meth = bad[0]
        raise SymmergeError(
            f"parameterisation {meth} does not keep {g.family} ({g.kind}) in its group: {g.kind} groups admit "
            f"{', '.join(g.structure.admits)}; choose per family, e.g. --param "
            f"{g.family}={g.structure.admits[0]},... (or --param expm, admitted by every kind)"
        )
    return out
