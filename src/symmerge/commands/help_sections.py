"""`align --help` and `merge --help` in sections, one per method, so that a reader finds the options of the
method they run together.

A matcher option goes into the section of the matchers that read it (`option_flags.users`): all of them,
"matching"; the data-driven ones, "data"; weight matching and those that start from it, "weight
matching"; learned and dual alone, "learned and dual matching"; any other set of readers, a section named
after them. Sections are argparse argument groups, printed in the order they are first asked for.
"""

from __future__ import annotations

import argparse

from ..match import registry
from . import out_dtype
from .option_flags import users as option_users

OUTPUT, MATCHING, DATA, WEIGHT, LEARNED, DEVICE, ROUNDS = (
    "output", "matching", "data", "weight matching", "learned and dual matching", "device and precision", "rounds")

#: what each section's heading line says beneath it
DESCRIPTIONS = {
    DATA: "activation, learned and dual matching run both models on batches of --data",
    WEIGHT: "learned and dual matching start from its solution, with these options",
    LEARNED: "--recipe gives the defaults marked (full) and (quick); every flag overrides it. Dual's fixed rates "
    "are half of learned's: its two sides move the relative element twice as fast",
    DEVICE: "the forward of learned and dual matching runs on --device in --dtype (group parameters, optimiser state "
    "and the exact algebra stay float32/float64; checkpoints keep their dtype); weight matching runs its large "
    "products and Procrustes solves on --device, in --precision",
}


def section_of(option: str) -> str:
    """The section of matcher option `option`, from the matchers that read it."""
    users = set(option_users(option))
    if users == set(registry.MATCHERS):
        return MATCHING
    if users == {m.name for m in registry.MATCHERS.values() if m.needs_data}:
        return DATA
    if users == {"weight"} | {m.name for m in registry.MATCHERS.values() if m.starts_from == "weight"}:
        return WEIGHT
    if users == {"learned", "dual"}:
        return LEARNED
    return "/".join(sorted(users)) + " matching"


class Sections:
    """The argument groups of one parser, made on first use, with their descriptions."""

    def __init__(self, parser: argparse.ArgumentParser):
        self.parser, self.groups = parser, {}

    def get(self, name: str, description: str | None = None):
        if name not in self.groups:
            self.groups[name] = self.parser.add_argument_group(name, description or DESCRIPTIONS.get(name))
        return self.groups[name]


def output_section(parser: argparse.ArgumentParser, out: str, report: str, force: str):
    """The "output" section: -o/--out, --json, --force and --out-dtype, with these helps; returns it."""
    group = parser.add_argument_group(OUTPUT)
    group.add_argument("-o", "--out", required=True, help=out)
    group.add_argument("--json", default=None, help=report)
    group.add_argument("--force", action="store_true", help=force)
    out_dtype.add_argument(group)
    return group
