"""How long each name of `pairs.py` takes to rebuild at 2 threads, from the training times in results/pairs.json.

At 2 threads a pair's two seeds train side by side, one thread each (the recorded models were trained at
1 thread each, and training's last bits depend on the thread count), so a pair takes as long as its slower
seed's recorded training time (a name of one model: that model's). Where a model's time is not in the
record (or the model has no record), the name's time is "not recorded": nothing is estimated. The times
were measured on a shared machine, so they are an upper bound for the same CPU alone more than a constant.
"""

from __future__ import annotations

import re

from pairs import PAIRS

#: the most a pair may take to rebuild at 2 threads (issue: "rebuilt in at most 30 minutes at 2 threads")
LIMIT_S = 30 * 60


def recorded_times(result: dict) -> dict[str, float]:
    """Seconds of training per model folder name, from every table column of `result` (pairs.json) whose
    title starts with "training" ("610 s", or "861" under "training s")."""
    out = {}
    for rec in result["records"]:
        for table in rec["tables"]:
            cols = [i for i, c in enumerate(table["columns"]) if c.startswith("training")]
            for row in table["rows"]:
                for i in cols:
                    m = re.fullmatch(r"(\d+(?:\.\d+)?)(?: s)?", row[i].strip())
                    if m:
                        out[row[0]] = float(m.group(1))
    return out


def rebuild_rows(result: dict) -> list[list[str]]:
    """[name, models, rebuild time at 2 threads, within LIMIT_S] for every name of `pairs.PAIRS`."""
    times = recorded_times(result)
    rows = []
    for name, (folder, _, seeds) in PAIRS.items():
        models = [folder.format(seed=s) for s in seeds]
        known = [times.get(m) for m in models]
        if None in known:
            rows.append([name, str(len(models)), "not recorded", "not known"])
            continue
        t = max(known)
        rows.append([name, str(len(models)), f"{t / 60:.0f} min ({t:.0f} s)", "yes" if t <= LIMIT_S else "no"])
    return rows


def section(result: dict, wrap=lambda text: text) -> list[str]:
    """The README's lines on rebuilding the pairs: how, the table, and which names exceed or lack a time
    (`wrap`: how the README wraps a paragraph)."""
    rows = rebuild_rows(result)
    over = [r[0] for r in rows if r[3] == "no"]
    missing = [r[0] for r in rows if r[2] == "not recorded"]
    timed = len(rows) - len(missing)
    verdict = (f"Over {LIMIT_S // 60} minutes: {', '.join(over)}." if over else
               f"Each of the {timed} names with recorded times rebuilds within {LIMIT_S // 60} minutes.")
    lines = ["### Rebuilding a pair at 2 threads", "",
             wrap("The two seeds of a pair side by side, one thread each (as the recorded models were trained), "
                  "then one more call that trains nothing and records both:"), "", "```bash",
             "python benchmarks/pairs.py NAME --seeds 0 --results - & python benchmarks/pairs.py NAME --seeds 1 "
             "--results - & wait", "python benchmarks/pairs.py NAME", "```", "",
             wrap(f"A pair then takes as long as its slower seed's training time recorded above (measured one model "
                  f"at a time at 1 thread, on a shared machine). {verdict} Not recorded (no training time in "
                  f"results/pairs.json, or no record): {', '.join(missing) if missing else 'none'}."), "",
             f"| name | models | rebuild time at 2 threads | within {LIMIT_S // 60} minutes |", "|---|---|---|---|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows] + [""]
