"""What a learned / dual run says at its end: the best step, its validation barrier with its standard
error, and how the validation curve moved after it (`after_best`), as JSON and as one line
(`end_line`). Read by `learned.learn` (into the report) and `symmerge align` (printed).

The best state has the lowest validation barrier of the run (`learn_loop.Run.evaluate`), so every
later evaluation stands at or above it: the curve after it either stayed within the noise (its
standard error, at least `FLAT`) or rose. A best state at the last evaluation says the run may have
stopped too soon.
"""

from __future__ import annotations

import math

from ..evaluation.forward import mean_se
from .learn_config import FLAT
from .learn_plan import batch_excess


def best_se(learner, val: list[dict], lams: list[float], losses: list[float]) -> float | None:
    """Standard error over `val` of the best state's barrier: the spread of each batch's excess at the
    curve's peak (`learner` holds the best state). None for one batch or a path below its line."""
    gap = [x - ((1 - t) * losses[0] + t * losses[-1]) for t, x in zip(lams, losses)]
    i = max(range(1, len(lams) - 1), key=lambda j: gap[j])
    se = mean_se(batch_excess(learner, val, lams[i])) if len(val) > 1 else math.nan
    return se if math.isfinite(se) else None


def after_best(history: list[dict], best_step: int, se: float | None) -> dict:
    """How the validation barrier moved after the best step: evaluations after it, the highest and
    the last barrier there, the rise, and `trend` ("last": the best was the last evaluation;
    "stayed": within max(se, FLAT); "rose"; "diverged": a later evaluation was not finite)."""
    best = next(h["barrier"] for h in history if h["step"] == best_step)
    later = [h["barrier"] for h in history if h["step"] > best_step]
    tol = max(se or 0.0, FLAT)
    out = {"evaluations_after": len(later), "tolerance": tol}
    if best is None:  # not even the start was finite
        out["trend"] = "diverged"
        return out
    if not later:
        before = [h["barrier"] for h in history if h["step"] < best_step and h["barrier"] is not None]
        out.update(trend="last", fell_by=(before[-1] - best) if before else None)
        return out
    finite = [x for x in later if x is not None]
    top = max(finite) if finite else None
    out.update(highest_after=top, last=later[-1], rise=None if top is None else top - best)
    if len(finite) < len(later):
        out["trend"] = "diverged"
    else:
        out["trend"] = "stayed" if top - best <= tol else "rose"
    return out


def end_line(report: dict) -> str:
    """One line: "best at step 400 of 1000: validation barrier 0.0120 ± 0.0030 (start 0.2500); after it
    rose to 0.0310 (last 0.0290)", plus the learning rate and how it was chosen."""
    a, se = report["after_best"], report.get("barrier_after_se")
    b = report["barrier_after"]
    head = (f"best at step {report['best_step']} of {report['steps']}: validation barrier {_f(b)}"
            f"{f' ± {se:.4f}' if se is not None else ''} (start {_f(report['barrier_before'])})")
    if a["trend"] == "last":
        fell = a.get("fell_by")
        tail = ("the last evaluation" + (f", {fell:.4f} below the one before: a longer run may go lower"
                                         if fell is not None and fell > a["tolerance"] else ""))
    elif a["trend"] == "stayed":
        tail = f"after it stayed within +{a['rise']:.4f} over {a['evaluations_after']} evaluations"
    elif a["trend"] == "rose":
        tail = f"after it rose to {a['highest_after']:.4f} (last {_f(a['last'])})"
    else:
        tail = "after it the loss stopped being finite (lower --lr)"
    if report.get("stopped_early"):
        tail += "; stopped early (--patience)"
    if report.get("extended_steps"):
        tail += (f"; learned {report['extended_steps']} steps past the planned {report['planned_steps']} "
                 "while the validation barrier kept falling (--extend)")
    plan = report.get("plan", {})
    rate = rate_text(plan["lr"], plan.get("lr_search")) if "lr" in plan else ""
    return f"{head}; {tail}" + (f"; {rate}" if rate else "")


def rate_text(lr: float, search: dict | None) -> str:
    """"lr 0.005", and for a rate `--lr auto` chose, how many rates its search tried and for how long."""
    how = f" (--lr auto: best of {len(search['rates'])} rates × {search['steps_each']} steps)" if search else ""
    return f"lr {lr:.3g}{how}"


def time_line(report: dict) -> str:
    """Where the run's time went, in one line: the loop (its validations, its steps past the plan), the rate
    search and the matcher it started from. Apart from `end_line`, which holds no timing, so that a report is the
    same on every run."""
    t = report.get("time")
    if not t:
        return ""
    parts = [f"{t['validation_s']:.0f} s validating"] + ([f"{t['past_plan_s']:.0f} s past the plan"]
                                                        if t.get("past_plan_s") else [])
    search = f", --lr auto's search {t['search_s']:.0f} s" if t.get("search_s") else ""
    start = f", its start {t['start_s']:.0f} s" if t.get("start_s") else ""
    return f"{t['loop_s']:.0f} s learning ({', '.join(parts)}){search}{start}"


def _f(x) -> str:
    return "nan" if x is None else f"{x:.4f}"
