"""The model card (README.md) of every checkpoint symmerge writes, made from the record of the operation that
wrote it (the `own` record `provenance.write_metadata` puts into symmerge.json; one key: the operation).

Front matter, as `huggingface_hub.ModelCard.load` reads it and the Hub shows it: `base_model` (the inputs,
by the Hub id they were read by, else by their folder's name; none for `train`), `tags` (`symmerge` and the
operation), `library_name: transformers`. Body: what the operation did, its method, groups and options,
the command line, symmerge's version, and the figures the command measured (objective, barriers, losses)
with the data they were measured on.

The card is deterministic: the same command on the same inputs writes the same bytes. Timings are left out
(`TIMING`), and an absolute path is shown by its last component only (relative paths as given; the full
paths are in symmerge.json beside the card).
"""

from __future__ import annotations

import json
import os
import shlex

from ..version import __version__

#: the record keys naming the operation's input checkpoints, per operation
INPUTS = {"transform": ("source",), "align": ("a", "b"), "interpolate": ("a", "b"), "merge": ("models",),
          "merge_aligned": ("input",), "expand": ("narrow", "like"), "train": ()}
#: the record keys that are measured figures (the rest are settings)
FIGURES = ("objective", "barrier_before", "barrier_after", "lambdas", "losses_before", "losses_after",
           "best_step", "final_train_loss", "validation", "test", "writer_scale", "score_scale")
#: keys left out: timings (they change from run to run) and what is too long for a card (symmerge.json has it)
TIMING = ("seconds", "wall_s", "time_s", "time", "seconds_by_step_kind", "pairwise_seconds", "barrier_seconds")
LEFT_OUT = ("history", "hub", "preset_values", "data_resolved")
#: a list of numbers longer than this is shown by its first and last values
SHORT = 12


#: what a checkpoint is, per operation ("align dual": dual matching), filled in from its record and inputs
SENTENCES = {
    "transform": "{source} re-parameterised by a random element of its symmetry group: the same function",
    "align": "{b} re-parameterised by {method} matching into the coordinates of {a}: {b}'s function",
    "align dual": ("one of {a} and {b} re-parameterised by dual matching, so that the straight line between the two "
                   "outputs is low-loss; it computes its input's function"),
    "interpolate": "(1 - λ)·{a} + λ·{b} in canonical form, λ = {lambda}",
    "merge": "the weighted average of {models} after {method} matching brought them into shared coordinates",
    "merge_aligned": "{input} re-parameterised by {method} matching into the coordinates of a merge: its own function",
    "expand": "{narrow} written in the wider config of {like}: {narrow}'s function",
    "train": "a {hf_class} trained from scratch (seed {seed})",
}


def what(op: str, rec: dict, name) -> str:
    """One sentence: what the checkpoint is."""
    names = {k: (", ".join(map(name, v)) if isinstance(v, list) else name(v)) for k, v in rec.items() if k in
             INPUTS.get(op, ())}
    key = "align dual" if op == "align" and rec.get("method") == "dual" else op
    try:
        return SENTENCES.get(key, op).format(**{**rec, **names})
    except (KeyError, IndexError):  # a record of another version: the operation's name
        return op


def text(meta: dict, op: str, command: list[str] | None, name) -> str:
    """The card (front matter and body) of a checkpoint whose symmerge.json is `meta`, written by operation `op`
    (`command`: the command line, None through the Python API); `name(path)`: an input as the card names it."""
    from huggingface_hub import ModelCardData

    rec = meta[op]
    inputs = [v for k in INPUTS.get(op, ()) for v in (rec[k] if isinstance(rec.get(k), list) else [rec.get(k)]) if v]
    data = ModelCardData(base_model=[name(p) for p in inputs] or None, tags=["symmerge", op.replace("_", "-")],
                         library_name="transformers")
    commits = {h["path"]: h["commit"] for h in meta.get("hub", [])}
    lines = [f"# {op.replace('_', ' ')} by symmerge", "", f"Written by symmerge {__version__}: {what(op, rec, name)}.", ""]
    if inputs:
        lines += ["## Inputs", ""] + [f"- `{name(p)}`" + (f" (commit {commits[p]})" if p in commits else "") for p in inputs]
        lines.append("")
    shown = {k: v for k, v in rec.items() if k not in INPUTS.get(op, ()) and k not in TIMING + LEFT_OUT
             and not k.endswith("_seconds")}
    settings = {k: v for k, v in shown.items() if k not in FIGURES}
    figures = {k: v for k, v in shown.items() if k in FIGURES}
    lines += ["## How it was made", "", f"- operation: `{op}`"] + [f"- {k}: {_value(v, name)}" for k, v in settings.items()]
    lines.append("")
    if command is not None:
        lines += ["```bash", "symmerge " + shlex.join(_short(a, name) for a in command), "```", "",
                  "(absolute paths are shortened to their last component; symmerge.json beside this card has them in full)", ""]
    if figures:
        where = f" on `{_short(str(rec['data']), name)}`" if rec.get("data") else ""
        lines += ["## Measured", "", f"Figures the command measured{where}:", ""]
        lines += [f"- {k}: {_value(v, name)}" for k, v in figures.items()] + [""]
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)


def _value(v, name) -> str:
    """A setting or figure on one line: numbers to 6 significant digits, long lists of numbers by their ends."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:.6g}" if isinstance(v, float) else str(v)
    if isinstance(v, list) and len(v) > SHORT and all(isinstance(x, (int, float)) for x in v):
        return f"{_value(v[0], name)} → {_value(v[-1], name)} ({len(v)} values)"
    if isinstance(v, list) and v and all(isinstance(x, float) for x in v):
        return "[" + ", ".join(_value(x, name) for x in v) + "]"
    if isinstance(v, str):
        return f"`{_short(v, name)}`"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_value(x, name)}" for k, x in v.items() if k not in TIMING)
    return f"`{json.dumps(_shortened(v, name))}`"


def _short(arg: str, name) -> str:
    """An argument as the card shows it: an absolute path (alone or as a --flag=value's value) as `name` gives it
    (a Hub snapshot by its id, anything else by its last component)."""
    flag, eq, value = arg.partition("=")
    if eq and flag.startswith("-"):
        return f"{flag}={_short(value, name)}"
    return name(arg) if os.path.isabs(arg) else arg


def _shortened(v, name):
    if isinstance(v, str):
        return _short(v, name)
    if isinstance(v, list):
        return [_shortened(x, name) for x in v]
    if isinstance(v, dict):
        return {k: _shortened(x, name) for k, x in v.items()}
    return v
