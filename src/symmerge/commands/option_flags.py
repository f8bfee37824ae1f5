"""Command-line flags built from the matchers' options classes (`match.options`): each field's default,
help text, parser and choices are declared once there, and `--help` shows them.

A field several matchers share becomes one flag, its help naming the matchers that read it; where its
default differs by matcher or by recipe, the flag's default is None (the options class fills it in) and
the help names each matcher's default.
"""

from __future__ import annotations

from dataclasses import MISSING, fields

from ..match import registry
from ..match.learn_config import RECIPES
from ..match.options import Options


def _fields(cls: type[Options]) -> dict:
    return {f.name: f for f in fields(cls)}


def option_fields() -> dict:
    """Every matcher option by name, in the order the matchers declare them (`registry.MATCHERS`)."""
    out = {}
    for m in registry.MATCHERS.values():
        for name, f in _fields(m.options).items():
            out.setdefault(name, f)
    return out


def users(option: str) -> list[str]:
    """The matchers that read `option`, themselves or through the matcher they start from."""
    return [name for name, m in registry.MATCHERS.items() if option in _fields(m.options)]


def help_of(option: str, cls: type[Options] | None = None) -> str:
    return (_fields(cls) if cls else option_fields())[option].metadata["help"]


def flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def add_option(p, option: str, text: str | None = None, recipes: tuple[str, ...] = tuple(RECIPES),
               default=MISSING, cls: type[Options] | None = None) -> None:
    """The flag of option `option` (of the matchers, or of options class `cls`) on parser `p`, with its
    default: shown by the help formatter, or, where it differs by method or recipe (None here: the options
    class fills it in), named per method in the help. `text`: the help (default: the methods that use it,
    then the field's help); `recipes`: the recipes whose defaults the help shows (merge runs one);
    `default`: the flag's default where the command gives one (align's --recipe)."""
    f = (_fields(cls) if cls else option_fields())[option]
    readers = [] if cls else users(option)
    text = f"{'/'.join(readers)}: {f.metadata['help']}" if text is None else text
    shown = ""
    if default is MISSING:
        default = f.default
        per = {m: _shown(m, option, recipes) for m in readers}
        from_recipe = any(_fields(registry.get(m).options)[option].metadata["recipe"] for m in readers)
        if len(set(per.values())) > 1 or from_recipe:
            texts: dict[str, list[str]] = {}  # the value's text -> the methods it is the default of
            for m, t in per.items():
                texts.setdefault(t, []).append(m)
            default = None
            shown = " (default: " + (next(iter(texts)) if len(texts) == 1 else
                                     "; ".join(f"{'/'.join(ms)}: {t}" for t, ms in texts.items())) + ")"
    kw = {"type": f.metadata["parse"]} if f.metadata["parse"] else {}
    if f.metadata["choices"]:
        kw["choices"] = f.metadata["choices"]
    p.add_argument(flag(option), default=default, help=f"{text}{shown}", **kw)


def _shown(method: str, option: str, recipes: tuple[str, ...]) -> str:
    """`method`'s default: `value`, or for a recipe's value `X (full), Y (quick)`."""
    defaults = registry.get(method).options()
    per = {r: defaults.default_for(option, r) for r in recipes}
    if len(set(map(_text, per.values()))) == 1:
        return _text(per[recipes[0]])
    return ", ".join(f"{_text(v)} ({r})" for r, v in per.items())


def _text(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(f"{x:g}" for x in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def options_of(args, method: str) -> Options:
    """The options of matcher `method` from parsed flags `args` (checked: `Options.__post_init__`)."""
    return registry.options(method, vars(args))
