"""Several processes (torchrun): data-parallel learned and dual matching.

Under `torchrun --nproc-per-node N -m symmerge align ... --method learned|dual` every process (rank)
holds both endpoints and the same group parameters. Each step every rank runs `Learner.loss` on its
rows of the step's global batch (rows `[r·B/N, (r+1)·B/N)`; every rank loads all batches, which are
deterministic), weights its loss by its share of the batch's predicted items (the HF loss is a mean
over predicted tokens, or images), and one all-reduce of one float64 bucket (the weighted losses, the
Ctrl-C flags and every gradient) makes each rank's gradient the gradient of the mean over the whole
batch: sum_r (n_r/n) mean_r = mean. Batch indices and λ come from (seed, step) alone
(`objectives.step_randomness`), so every rank takes the same step; the validation curve splits each
validation batch the same way and all-reduces the weighted sums, so every rank gets the same numbers
and picks the same best state. Rank 0 alone writes OUT, the report and the checkpoint; every rank reads
the checkpoint on `--resume`.

Invariant: after k steps the group parameters equal a single-process run over the same global batches
up to the rounding of the summation order (tests/test_distributed.py: float32, 1e-5 relative); ranks
agree bitwise, since every rank gets the same all-reduced bucket. Where it fails: a rank whose rows
hold no predicted item (all labels -100) makes its local mean NaN; symmerge's own data never does.

The backend follows the device: gloo on the CPU, NCCL on CUDA (each rank on `cuda:LOCAL_RANK`). The
process group has a timeout (`SYMMERGE_DIST_TIMEOUT` seconds, default 600) so that a rank that dies or
hangs ends the others with one clear error rather than a hang. Errors that every rank must share (a
rank without the input files or the checkpoint, a batch the ranks cannot split) go through `agree`:
every rank raises, rank 0 prints. Commands without a distributed path run on rank 0 alone.
"""

from __future__ import annotations

import os
import re
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import SymmergeError

TIMEOUT_ENV = "SYMMERGE_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0


def launched() -> bool:
    """Started by torchrun (or its environment) with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def timeout() -> timedelta:
    text = os.environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise SymmergeError(f"{TIMEOUT_ENV}={text!r} is not a positive number of seconds")
    return timedelta(seconds=seconds)


def predicted_items(batch: dict) -> int:
    """How many items the HF loss of `batch` averages over: next-token labels (HF shift: position t is
    scored against labels[:, t + 1]) or one label per image, those set to -100 left out."""
    labels = batch["labels"]
    if labels.ndim == 2:
        labels = labels[:, 1:]
    return int((labels != -100).sum())


def _rows(batch: dict) -> int:
    return len(next(v for v in batch.values() if torch.is_tensor(v)))


class Group:
    """This process's place among the ranks (`rank` of `world`) and the collectives the learning loop
    uses. Alone (`world == 1`) every method is the identity, so a single process runs unchanged."""

    def __init__(self, rank: int = 0, world: int = 1, device: torch.device | None = None, shard: int = 0):
        self.rank, self.world = rank, world
        self.device = torch.device("cpu") if device is None else device  # where collectives run
        #: the processes each endpoint is sharded over (`match/sharded.py`; a divisor of `world`), 0: whole on each
        self.shard = shard
        self._meshes: dict = {}

    def mesh(self):
        """The device mesh FSDP2 shards the endpoints over: 1-D over every process when `shard` is `world`,
        else (world / shard, shard), named ("replicate", "shard"): consecutive ranks share one copy (ranks
        on one node, when torchrun numbers them node by node), replicated across the groups. Every rank must
        call it (building a 2-D mesh makes process groups, a collective)."""
        if self.shard not in self._meshes:
            from torch.distributed.device_mesh import init_device_mesh

            k = self.shard
            shape, names = ((k,), ("shard",)) if k == self.world else ((self.world // k, k), ("replicate", "shard"))
            self._meshes[k] = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        return self._meshes[self.shard]

    @property
    def main(self) -> bool:
        return self.rank == 0

    # --- batches --------------------------------------------------------------------------------------

    def check_batches(self, batches: list[dict], what: str) -> None:
        """Every batch must give each rank at least one row (the batch size is global; `local` splits it)."""
        for i, b in enumerate(batches):
            n = _rows(b)
            if n < self.world:
                last = " (the last, shorter batch: choose --max-batches so that it is left out)" \
                    if i == len(batches) - 1 and i > 0 else ""
                raise SymmergeError(f"{what} batch {i} holds {n} item{'s' if n != 1 else ''}, fewer than the "
                                    f"{self.world} processes{last}; choose a --batch-size of at least {self.world}")

    def check_data(self, train: list[dict], val: list[dict]) -> None:
        self.check_batches(train, "training")
        self.check_batches(val, "validation")

    def local(self, batch: dict) -> dict:
        """This rank's rows of a global batch: consecutive blocks whose sizes differ by at most one where the
        ranks do not divide the rows (a split's last, shorter batch). Each rank's mean loss is weighted by its
        `share` of the predicted items, so the sum over the ranks is the whole batch's mean whatever the split."""
        if self.world == 1:
            return batch
        n = _rows(batch)
        lo, hi = self.rank * n // self.world, (self.rank + 1) * n // self.world
        return {k: v[lo:hi] if torch.is_tensor(v) else v for k, v in batch.items()}

    def share(self, batch: dict) -> float:
        """This rank's part of the batch's predicted items: the weight of its local mean loss."""
        return 1.0 if self.world == 1 else predicted_items(self.local(batch)) / predicted_items(batch)

    # --- collectives ----------------------------------------------------------------------------------

    def collective(self, what: str, fn) -> None:
        """Run collective call `fn` (`what` names it in the error when a peer is lost)."""
        _collective(what, fn)

    def _all_reduce(self, flat: torch.Tensor, what: str) -> torch.Tensor:
        """The sum over the ranks (on the collectives' device; the same tensor returned to every rank)."""
        buf = flat.to(self.device)
        _collective(what, lambda: dist.all_reduce(buf))
        return buf

    def sync(self, params: list[torch.Tensor], loss: torch.Tensor, stop: bool) -> tuple[float, bool]:
        """One bucket per step: the weighted losses, the stop flags and every gradient summed over the
        ranks; gradients are written back in place. Returns (the global mean loss, any rank stopped)."""
        if self.world == 1:
            return float(loss.detach()), stop
        grads = [p.grad for p in params if p.grad is not None]  # the same parameters on every rank
        f64 = dict(device=self.device, dtype=torch.float64)
        head = torch.stack([loss.detach().to(**f64), torch.tensor(float(stop), **f64)])
        flat = self._all_reduce(torch.cat([head, *(g.detach().reshape(-1).to(**f64) for g in grads)]),
                                "the gradient all-reduce")
        at = 2
        for g in grads:
            g.copy_(flat[at:at + g.numel()].view_as(g))
            at += g.numel()
        return float(flat[0]), bool(flat[1] > 0)

    def curve(self, learner, batches: list[dict], lams: list[float]) -> list[float]:
        """`learner.curve(batches, lams)` (mean over batches of each batch's mean loss) with every batch
        split over the ranks: each rank's local means weighted by its share, summed over the ranks."""
        if self.world == 1:
            return learner.curve(batches, lams)
        local = torch.tensor([[x * self.share(b) for x in learner.curve([self.local(b)], lams)] for b in batches],
                             dtype=torch.float64)  # (batches, lams)
        return (self._all_reduce(local, "the validation curve").sum(0) / len(batches)).cpu().tolist()

    def broadcast(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Rank 0's tensors on every rank (the starting element: computed by every rank, taken from one)."""
        if self.world == 1:
            return tensors
        out = {}
        for k in sorted(tensors):
            buf = tensors[k].detach().clone().to(self.device)
            _collective("the broadcast of the starting element", lambda b=buf: dist.broadcast(b, src=0))
            out[k] = buf.to(tensors[k].device)
        return {k: out[k] for k in tensors}

    def agree(self, fn, main_only: bool = False):
        """Run `fn` (on rank 0 alone with `main_only`) and share its fate: when it fails on any rank with
        a user's error, every rank raises that error (rank 0 prints it, see `prints`)."""
        err, value = None, None
        try:
            if self.main or not main_only:
                value = fn()
        except (SymmergeError, OSError) as e:
            if self.world == 1:
                raise
            err = _words(e)
        if self.world == 1:
            return value
        errors = [None] * self.world
        _collective("sharing the start-up checks", lambda: dist.all_gather_object(errors, err))
        failed = [(r, e) for r, e in enumerate(errors) if e is not None]
        if failed:
            r, text = failed[0]
            e = SymmergeError(text if r == 0 else f"rank {r}: {text}")
            e.agreed = True
            raise e
        return value

    def gather(self, tensors: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        """Every rank's tensors (for checks that ranks agree)."""
        if self.world == 1:
            return [tensors]
        out = [None] * self.world
        _collective("gathering", lambda: dist.all_gather_object(out, {k: v.detach().cpu() for k, v in tensors.items()}))
        return out


def _words(e: BaseException) -> str:
    if isinstance(e, OSError) and not isinstance(e, SymmergeError):
        return f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else "")
    return str(e)


def _first_line(e: BaseException) -> str:
    """The first line of a backend's error, without its source location ("[.../pair.cc:537] ...")."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return re.sub(r"^\[[^\]]*\]\s*", "", first)[:200]


def _collective(what: str, fn) -> None:
    """A collective call; a peer that died or timed out becomes one clear error instead of a traceback."""
    try:
        fn()
    except (RuntimeError, dist.DistError) as e:
        raise SymmergeError(f"rank {dist.get_rank()}: lost contact with the other processes during {what} "
                            f"(one of them stopped, died or hung past {TIMEOUT_ENV}={timeout().total_seconds():g}s; "
                            f"see its own error): {_first_line(e)}") from None


SOLO = Group()
_current = SOLO


def current() -> Group:
    return _current


def shard_size(shard: int | None, world: int) -> int:
    """The processes each endpoint is sharded over for `--shard-endpoints [K]`: None (not given) 0, none;
    0 (given without K) every process; K, which must divide the processes (the mesh is world/K x K)."""
    if shard is None:
        return 0
    if shard < 0:
        raise SymmergeError(f"--shard-endpoints {shard}: give a positive number of processes per shard group")
    if shard and world % shard:
        raise SymmergeError(f"--shard-endpoints {shard}: a mesh of groups of {shard} processes does not divide the "
                            f"{world} process{'es' if world > 1 else ''} started; give a divisor of {world}, or no "
                            "number to shard over every process")
    return shard or world


def init(device=None, shard: int | None = None) -> Group:
    """Join torchrun's process group (once); alone, `SOLO`. `device`: the run's --device ("cpu", "cuda",
    None for its default); "cuda" means `cuda:LOCAL_RANK`, made the current GPU, so that every later
    "cuda" (`devices.resolve`) is this rank's own. `shard`: --shard-endpoints (`shard_size`: checked here,
    before the ranks join, so that every rank refuses it alike). Returns the group with the rank's device."""
    global _current
    size = shard_size(shard, int(os.environ.get("WORLD_SIZE", "1")))
    if not launched():
        return SOLO
    if _current is not SOLO:
        return _current
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))  # --device's default
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if dev.type == "cuda":
        if dev.index is not None:
            raise SymmergeError(f"--device {dev} under torchrun would put every process on one GPU; pass --device cuda "
                                "(each process then takes cuda:LOCAL_RANK)")
        if local >= torch.cuda.device_count():
            raise SymmergeError(f"process {local} on this machine has no GPU of its own ({torch.cuda.device_count()} "
                                "visible); start at most that many processes per node")
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    try:
        dist.init_process_group(backend, timeout=timeout(), device_id=dev if dev.type == "cuda" else None)
    except (RuntimeError, ValueError, dist.DistError) as e:
        raise SymmergeError(f"cannot join the other processes ({backend}): {_first_line(e)}") from None
    _current = Group(dist.get_rank(), dist.get_world_size(), dev, size)
    return _current


def close() -> None:
    """Leave the process group (at exit)."""
    global _current
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _current = SOLO


def prints(e: BaseException) -> bool:
    """Whether this process prints error `e`: alone always; under torchrun an error every rank shares
    (`agree`, or one raised before the ranks joined, the same everywhere) only on rank 0."""
    if not launched():
        return True
    return env_rank() == 0 or not (getattr(e, "agreed", False) or _current is SOLO)


def idle(args) -> bool:
    """Under torchrun, a command without a distributed path runs on rank 0 alone: the others stop here
    (rank 1 says so once)."""
    if not launched() or env_rank() == 0:
        return False
    spreads = getattr(args, "spreads", None)
    if spreads is not None and spreads(args):
        return False
    if env_rank() == 1:
        print(f"symmerge {args.command}: runs in the first process alone (only align --method learned|dual "
              "spreads over several; merge --method learned|dual too)", file=sys.stderr)
    return True
