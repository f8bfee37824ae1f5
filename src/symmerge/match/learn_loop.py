"""The training loop of learned / dual matching: steps, validation barrier, best state, early stopping,
learning on past the plan, checkpoints and resume (see `learned.py` for the method and `learn_state.py`
for the files).

Learning on (`LearnConfig.extend` > 1): a run whose best state is its last evaluation, its value (the
barrier, or the many-model objective) below the one before by more than `FLAT` nats, was still improving
when its cosine schedule ended. It then learns one more chunk (a quarter of the planned steps, whole
evaluation intervals) on a cosine cycle of its own
from `RESTART` times the planned rate, and again after each chunk that ends the same way, while the steps stay
within `extend` times the planned ones. The best state is kept as always, so learning on never makes the
result worse; it costs at most (extend - 1) x the planned steps. Where it fails: a curve that improves
by less than FLAT per evaluation, or whose gain at the end came from the schedule's annealing alone,
stops at the plan.

Every step's randomness (which batch, which lambda) is a function of (seed, step) alone -- and, for
`lam_sampling="peak"`, of the last validation curve, which the checkpoint holds --, so a run resumed
from a checkpoint takes exactly the steps an uninterrupted run takes.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from dataclasses import dataclass, replace

import torch

from ..errors import SymmergeError
from ..runtime import distributed
from ..runtime.progress import tqdm
from ..store.optim_state import optimizer_tensors, restore_optimizer
from .learn_config import FLAT, IMPLIED
from .learn_state import check_settings, load_state, save_state
from .learner import Learner, rate_groups

#: the prefix of Adam's state in a checkpoint's tensors
ADAM = "adam."


class Interrupted(KeyboardInterrupt):
    """Raised after the checkpoint was written, when a run is stopped (Ctrl-C or `on_step`)."""


@dataclass
class Result:
    elements: dict | list  # pair: side ("A" or "B") -> full element for that input; many: one per model
    report: dict


def _cosine_lr(lr: float, step: int, total: int) -> float:
    return lr * 0.5 * (1 + math.cos(math.pi * step / max(total, 1)))


#: the rate each cycle of learning on starts from, as a fraction of the planned rate: low, since the plan ended
#: annealed at its best state and a restart near the planned rate can leave it for a worse one (measured on the
#: Llama demo pair: the notes of its record in benchmarks/results/default_dual.json)
RESTART = 0.1


def finite_gradients(params: list[torch.Tensor]) -> bool:
    """Whether every gradient of `params` is finite: a finite loss can still overflow in its backward, and one
    Adam step on a NaN gradient makes every later element NaN (the same on every process: gradients are summed
    before this is asked)."""
    grads = [p.grad for p in params if p.grad is not None]
    return not grads or bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())  # one host sync per step


def scheduled_lr(lr: float, step: int, planned: int, chunk: int) -> float:
    """The rate of `step`: cosine decay over the `planned` steps, then, for the steps learned on past
    them, a cosine cycle per `chunk` steps from lr * RESTART."""
    if step < planned or chunk < 1:
        return _cosine_lr(lr, step, planned)
    return _cosine_lr(lr * RESTART, (step - planned) % chunk, chunk)


def extension_chunk(planned: int, eval_every: int) -> int:
    """Steps of one chunk learned on past the plan: about a quarter of the plan, whole evaluation intervals."""
    return eval_every * max(1, round(planned / 4 / eval_every))


class _StopFlag:
    """Ctrl-C sets a flag; the loop checkpoints at the next step boundary and raises `Interrupted`."""

    def __init__(self):
        self.set, self.old = False, None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGINT, lambda *_: setattr(self, "set", True))
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
        return False


class Run:
    def __init__(self, learner: Learner, train, val, checkpoint, on_step):
        self.learner, self.train, self.val, self.ckpt, self.on_step = learner, train, val, checkpoint, on_step
        self.group = distributed.current()  # several processes: each takes its rows of every batch
        self.stop = False
        self.objective = learner.objective(learner.cfg)
        self.cfg = replace(learner.cfg, lam_sampling=self.objective.sampling)  # the sampling taken, in settings
        tensors = learner.trainables()
        groups = rate_groups(learner.slots, learner.spec, self.cfg.lr_scale)  # Adam's parameter order: the names'
        self.names = [n for _, names in groups for n in names]
        self.params = [tensors[n] for n in self.names]  # in Adam's order, for the gradient sync
        self.opt = torch.optim.Adam([{"params": [tensors[n] for n in names], "scale": factor}
                                     for factor, names in groups], lr=self.cfg.lr)
        self.meta = {"step": 0, "history": [], "best_step": 0, "bad_evals": 0,
                     "stopped_early": False, "diverged": False, "done": False, "time_s": 0.0, "endpoint_losses": None,
                     "validation_s": 0.0, "past_plan_s": 0.0,
                     "total": self.cfg.steps, "extended": 0}

    # --- state ---
    def tensors(self) -> dict[str, torch.Tensor]:
        out = {f"param.{k}": v for k, v in self.learner.trainables().items()}
        out.update({f"best.{k}": v for k, v in self.best.items()})
        out.update({f"fixed.{s.key}.{k}": v for s in self.learner.slots for k, v in s.fixed.items()})
        out.update({f"init.{k}": v for k, v in self.learner.start_tensors().items()})
        out.update(optimizer_tensors(self.opt, self.names, ADAM))
        return out

    def save(self) -> None:
        if self.ckpt is not None and self.group.main:
            save_state(self.ckpt, self.tensors(), {**self.meta, "settings": self.settings()})

    def settings(self) -> dict:
        """What must be equal to resume: the configuration's and the objective's settings."""
        return {**self.cfg.settings(), **self.objective.settings()}

    def load(self) -> None:
        tensors, meta = load_state(self.ckpt)
        check_settings({**IMPLIED, **meta["settings"]}, self.settings(), self.ckpt)
        for k, v in self.learner.start_tensors().items():
            if not torch.equal(tensors[f"init.{k}"], v):
                raise SymmergeError(f"the checkpoint in {self.ckpt} started from a different initial element; "
                                    "resume with the same --start-from or start a new run")
        with torch.no_grad():
            for k, t in self.learner.trainables().items():
                t.copy_(tensors[f"param.{k}"])
        for s in self.learner.slots:
            for k in s.fixed:
                s.fixed[k] = tensors[f"fixed.{s.key}.{k}"]
        self.best = {k: tensors[f"best.{k}"] for k in self.names}
        restore_optimizer(self.opt, self.names, tensors, ADAM)
        self.meta = {k: meta.get(k, v) for k, v in self.meta.items()}

    # --- evaluation ---
    def evaluate(self, step: int) -> None:
        t0 = time.perf_counter()
        self._evaluate(step)
        self.meta["validation_s"] += time.perf_counter() - t0

    def _evaluate(self, step: int) -> None:
        m, obj = self.meta, self.objective
        if m["endpoint_losses"] is None:  # the endpoints compute their inputs' functions: fixed for the run
            m["endpoint_losses"] = self.group.curve(self.learner, self.val, obj.ends)
        entry = {"step": step, **obj.entry(m["endpoint_losses"], self.group.curve(self.learner, self.val, obj.inner))}
        best = next((h for h in m["history"] if h["step"] == m["best_step"]), None)
        score, best_score = obj.score(entry), None if best is None else obj.score(best)
        m["history"].append(entry)  # a figure that is not finite is written as null and is never the best
        if score is not None and (best_score is None or score < best_score):  # the first of equals stays
            m["best_step"], m["bad_evals"] = step, 0
            self.best = {k: v.detach().clone() for k, v in self.learner.trainables().items()}
        else:
            m["bad_evals"] += 1
            if self.cfg.patience and m["bad_evals"] >= self.cfg.patience:
                m["stopped_early"] = True

    def _learn_on(self) -> bool:
        """At the end of the steps so far: add a chunk when the best state is the last evaluation, below
        the one before by more than FLAT, and the cap allows it (module docstring). Every process decides
        alike (the history is the same everywhere)."""
        m, cfg = self.meta, self.cfg
        h = m["history"]
        chunk = extension_chunk(cfg.steps, cfg.eval_every)
        if cfg.extend <= 1 or m["diverged"] or len(h) < 2 or m["best_step"] != h[-1]["step"]:
            return False
        last, before = self.objective.value(h[-1]), self.objective.value(h[-2])
        fell = last is not None and before is not None and before - last > FLAT
        if not fell or m["total"] + chunk > math.floor(cfg.extend * cfg.steps):
            return False
        m["total"] += chunk
        m["extended"] += chunk
        return True

    def train_step(self, step: int, stop: bool = False) -> float:
        """One optimiser step; several processes take their rows of the batch and sum their gradients
        (and `stop`, Ctrl-C's flag: `self.stop` says whether any process had it set)."""
        idx, mix = self.objective.draw(step, len(self.train), self.meta["history"])
        lr = scheduled_lr(self.cfg.lr, step, self.cfg.steps, extension_chunk(self.cfg.steps, self.cfg.eval_every))
        for pg in self.opt.param_groups:
            pg["lr"] = lr * pg["scale"]
        self.opt.zero_grad(set_to_none=True)
        batch = self.train[idx]
        loss = self.learner.loss(self.group.local(batch), mix)
        if self.group.world > 1:
            loss = loss * self.group.share(batch)
        loss.backward()
        total, self.stop = self.group.sync(self.params, loss, stop)
        if not (math.isfinite(total) and finite_gradients(self.params)):  # keep the best state, never step into NaN
            self.meta["diverged"] = True
            return float("nan")
        self.opt.step()
        return total

    def go(self, resume: bool) -> Result:
        if resume:
            if self.ckpt is None:
                raise SymmergeError("--resume needs a checkpoint folder")
            self.group.agree(self.load)  # every process reads the checkpoint
        else:
            self.best = {k: v.detach().clone() for k, v in self.learner.trainables().items()}
            self.evaluate(0)
        m, cfg = self.meta, self.cfg
        bar = tqdm(total=cfg.steps, initial=m["step"], disable=not (cfg.progress and self.group.main),
                   desc=f"{cfg.method} {self.objective.task}")
        t0 = time.perf_counter()
        with _StopFlag() as stop:
            while not m["done"] and not m["stopped_early"] and (m["step"] < m["total"] or self._learn_on()):
                bar.total = m["total"]
                loss = self.train_step(m["step"], stop.set)
                if m["diverged"]:
                    if self.group.main:
                        tqdm.write(f"{cfg.method} matching: the loss or its gradient is not finite at step {m['step']}; "
                                   "keeping the best state (lower --lr)")
                    break
                m["step"] += 1
                bar.update(1)
                if m["step"] % cfg.eval_every == 0 or m["step"] == m["total"]:
                    self.evaluate(m["step"])
                bar.set_postfix(loss=f"{loss:.4f}", validation=str(self.objective.value(m["history"][-1]))[:6])
                dt, t0 = time.perf_counter() - t0, time.perf_counter()
                m["time_s"] += dt
                if m["step"] > cfg.steps:
                    m["past_plan_s"] += dt
                if self.stop or (self.on_step is not None and self.on_step(m["step"])):
                    self.save()
                    bar.close()
                    where = f"checkpoint in {self.ckpt}: rerun with --resume" if self.ckpt else "no checkpoint folder given"
                    raise Interrupted(f"stopped at step {m['step']}; {where}")
                if m["step"] % cfg.checkpoint_every == 0:
                    self.save()
        bar.close()
        m["done"] = True
        self.save()
        self.release()
        return self.result()

    def release(self) -> None:
        """Free the gradients and the optimiser's moments once the run is done and saved: the best state's elements
        are built after, beside the frozen endpoints, and no step follows."""
        self.opt.zero_grad(set_to_none=True)
        self.opt.state.clear()

    def result(self) -> Result:
        with torch.no_grad():
            for k, t in self.learner.trainables().items():
                t.copy_(self.best[k])
        m, learner = self.meta, self.learner
        report = {
            "method": self.cfg.method, "steps": m["step"], "planned_steps": self.cfg.steps,
            "extended_steps": m["extended"], "time_s": round(m["time_s"], 3),
            # the loop's seconds; validation_s: every validation (the start's too), past_plan_s: the steps learned on
            "time": {"loop_s": round(m["time_s"], 3), "validation_s": round(m["validation_s"], 3),
                     "past_plan_s": round(m["past_plan_s"], 3)},
            **self.objective.report(m["history"], m["best_step"], m["endpoint_losses"]),
            "best_step": m["best_step"], "stopped_early": m["stopped_early"], "diverged": m["diverged"],
            "parameterisation": {s.group: (s.param.method if s.param else "straight-through") for s in learner.slots},
            "fixed_groups": learner.fixed_groups, "settings": self.cfg.settings(), "history": m["history"],
        }
        return Result(learner.final_elements(), report)
