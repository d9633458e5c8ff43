"""Typed config values: one check per kind of value, each error naming the full key and what is valid.

Hydra parses `x=true` as a boolean and `x=abc` as a string, and Python's bool is a subclass of int, so `int(value)`
would run `method.gamma=true` as γ=1 and `float(value)` would fail without naming the key. So numbers are never
booleans or strings here, floats are finite, and ranges are stated in the message. Method and dataset options are
checked against the type hints of the registered class's `__init__` (`check_options`): a new option needs no code.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from typing import Any, Iterable, Literal, overload

from specbench.common.errors import UserError

NoneType = type(None)
ON_LONG_PROMPT = ("error", "truncate")  # the values of the top-level key on_long_prompt
MISSING = "???"  # a mandatory config value not set yet (omegaconf.MISSING)


class OptionError(UserError, ValueError):
    """A config value of the wrong type or out of range; the message names the key and what is valid."""


def shown(value: Any) -> str:
    """The value as the error shows it, with its type when that is the problem ('true' is a boolean here)."""
    kinds = {bool: "a boolean", str: "a string", list: "a list", dict: "a mapping"}
    kind = kinds.get(type(value))
    return f"{value!r} ({kind})" if kind else repr(value)


def as_override(value: Any) -> str:
    """A value as it is written on the command line: true, false, null, 5, rejection."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def fail(key: str, what: str, value: Any, null: bool = False) -> OptionError:
    """The error for `key`: '<key> must be <what>[ or null], got <value>'."""
    return OptionError(f"{key} must be {what}{' or null' if null else ''}, got {shown(value)}")


def bounds(low: float | None, high: float | None, low_open: bool = False) -> str:
    """The range in words: '>= 1', 'in (0, 1]', ''."""
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low}, {high}]"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    return f" <= {high}" if high is not None else ""


def in_bounds(value: float, low: float | None, high: float | None, low_open: bool) -> bool:
    """Is low <= value <= high (low < value when low_open)?"""
    above = low is None or (value > low if low_open else value >= low)
    return above and (high is None or value <= high)


@overload
def integer(value: Any, key: str, low: int | None = None, high: int | None = None, null: Literal[False] = False
            ) -> int: ...
@overload
def integer(value: Any, key: str, low: int | None = None, high: int | None = None, null: bool = False
            ) -> int | None: ...
def integer(value: Any, key: str, low: int | None = None, high: int | None = None, null: bool = False
            ) -> int | None:
    """An int (not a bool, float or string) in [low, high]; None passes when `null`."""
    if value is None and null:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not in_bounds(value, low, high, False):
        raise fail(key, "an integer" + bounds(low, high), value, null)
    return value


@overload
def real(value: Any, key: str, low: float | None = None, high: float | None = None, low_open: bool = False,
         null: Literal[False] = False) -> float: ...
@overload
def real(value: Any, key: str, low: float | None = None, high: float | None = None, low_open: bool = False,
         null: bool = False) -> float | None: ...
def real(value: Any, key: str, low: float | None = None, high: float | None = None, low_open: bool = False,
         null: bool = False) -> float | None:
    """A finite number (int or float, not a bool or string) in the range, as a float; None passes when `null`."""
    if value is None and null:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or not in_bounds(value, low, high, low_open):
        raise fail(key, "a finite number" + bounds(low, high, low_open), value, null)
    return float(value)


@overload
def boolean(value: Any, key: str, null: Literal[False] = False) -> bool: ...
@overload
def boolean(value: Any, key: str, null: bool = False) -> bool | None: ...
def boolean(value: Any, key: str, null: bool = False) -> bool | None:
    """true or false (not 1, 'yes' or 'no': bool('no') is True)."""
    if (value is None and null) or isinstance(value, bool):
        return value
    raise fail(key, "true or false", value, null)


@overload
def text(value: Any, key: str, null: Literal[False] = False) -> str: ...
@overload
def text(value: Any, key: str, null: bool = False) -> str | None: ...
def text(value: Any, key: str, null: bool = False) -> str | None:
    """A string; None passes when `null`."""
    if (value is None and null) or isinstance(value, str):
        return value
    raise fail(key, "a string", value, null)


def choice(value: Any, key: str, choices: Iterable[Any]) -> Any:
    """One of `choices`, compared with its type (true is not 1, 'true' is not true)."""
    choices = tuple(choices)
    if any(type(value) is type(c) and value == c for c in choices):
        return value
    names = ", ".join(as_override(c) for c in choices)
    raise fail(key, f"one of {names}", value)


def strings(value: Any, key: str, null: bool = False) -> list[str] | None:
    """A list of strings (a bare string would otherwise be read as a list of its characters)."""
    if value is None and null:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
        raise fail(key, "a list of strings, e.g. [\"\\n\\n\"]", value, null)
    return list(value)


def stop_strings(value: Any, key: str) -> list[str] | None:
    """A list of non-empty strings or null (an empty stop string is found in every text)."""
    found = strings(value, key, null=True)
    if found and not all(found):
        raise OptionError(f"{key} must be a list of non-empty strings (e.g. [\"\\n\\n\"]) or null, got {shown(value)}: "
                          "an empty one would stop every generation at its first token")
    return found


def typed(value: Any, hint: Any, key: str) -> Any:
    """`value` checked against a type hint: bool, int, float, str, list[str] and `X | None` of them; others pass."""
    null = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not NoneType]
        null = len(args) < len(typing.get_args(hint))
        if len(args) != 1:  # a union of several types: left to the class
            return value
        hint = args[0]
    if hint is bool:
        return boolean(value, key, null)
    if hint is int:
        return integer(value, key, null=null)
    if hint is float:
        return real(value, key, null=null)
    if hint is str:
        return text(value, key, null)
    if typing.get_origin(hint) in (list, tuple) and typing.get_args(hint)[:1] == (str,):
        return strings(value, key, null)
    return value


def init_options(cls: type) -> dict[str, inspect.Parameter]:
    """The keyword options `cls(...)` accepts, name -> parameter (type hint as `annotation`): its `__init__`'s named
    parameters and, while an `__init__` forwards `**options`, the next one's up the MRO (a subclass's wins)."""
    found: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        hints = typing.get_type_hints(init)
        params = list(inspect.signature(init).parameters.values())[1:]  # without self
        for p in params:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                found.setdefault(p.name, p.replace(annotation=hints.get(p.name, Any)))
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return found


def unknown_options(what: str, unknown: list[str], known: Iterable[str], given: str = "") -> OptionError:
    """The error for options that `what` (e.g. "method 'vanilla'") does not accept, listing the valid ones;
    `given` shows how they were given (e.g. " (+method.gama=3)")."""
    return OptionError(f"{what} got unknown options {unknown}{given}; valid options: {', '.join(sorted(known)) or 'none'}")


def check_options(cls: type, options: dict[str, Any], prefix: str, what: str) -> dict[str, Any]:
    """Each option checked against `cls.__init__`'s type hints and named `<prefix>.<option>`; unknown ones
    fail with the list of valid ones (`what`, e.g. "method 'vanilla'", names the owner)."""
    known = init_options(cls)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise unknown_options(what, unknown, known)
    checked = {}
    for k, v in options.items():
        try:
            checked[k] = typed(v, known[k].annotation, f"{prefix}.{k}")
        except OptionError as err:
            default = known[k].default
            if default is known[k].empty:
                raise
            raise OptionError(f"{err}; {what} has {k}={as_override(default)} by default") from None
    return checked


def unset_keys(value: Any, key: str = "") -> list[str]:
    """The dotted keys of a plain, unresolved config (OmegaConf.to_container(cfg)) that hold the mark of a
    mandatory value, ??? (Hydra's MISSING)."""
    if isinstance(value, dict):
        return [k for name, v in value.items() for k in unset_keys(v, f"{key}.{name}" if key else str(name))]
    if isinstance(value, list):
        return [k for i, v in enumerate(value) for k in unset_keys(v, f"{key}[{i}]")]
    return [key] if value == MISSING else []


def check_mandatory(cfg: dict[str, Any]) -> None:
    """Fail naming every mandatory value (???) the plain, unresolved config leaves unset."""
    unset = unset_keys(cfg)
    if unset:
        raise OptionError(f"mandatory config values are not set: {', '.join(unset)}; give each a value on the "
                          f"command line (e.g. {unset[0]}=<value>) or in a config file (conf/local/default.yaml)")


def threads_setting(value: Any) -> int | Literal["auto"] | None:
    """The top-level key `threads`: auto, an integer >= 1, or null (torch's default)."""
    if value == "auto" or value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise OptionError(f"threads must be auto (the CPUs not already busy), an integer >= 1 or null (torch's "
                      f"default: every core), got {shown(value)}")


ENGINE_KEYS = ("compile",)  # conf/config.yaml's engine block


def engine_compile(cfg: dict[str, Any]) -> bool:
    """engine.compile (true: the compiled decode path, specbench.decoding.compiled); unknown engine keys fail."""
    engine = cfg.get("engine") or {}
    if not isinstance(engine, dict):
        raise OptionError(f"engine must be a mapping with the keys {', '.join(ENGINE_KEYS)}, got {shown(engine)}")
    unknown = sorted(set(engine) - set(ENGINE_KEYS))
    if unknown:
        raise OptionError(f"unknown engine keys {', '.join('engine.' + k for k in unknown)}; valid: "
                          f"{', '.join('engine.' + k for k in ENGINE_KEYS)}")
    compile_ = boolean(engine.get("compile", False), "engine.compile")
    if compile_ and cfg.get("batch_size", 1) != 1:
        raise OptionError(f"engine.compile=true decodes one example at a time (got batch_size="
                          f"{cfg.get('batch_size')}); set batch_size=1 or engine.compile=false")
    return compile_


def check_run_settings(cfg: dict[str, Any]) -> None:
    """The top-level keys of a benchmark run (conf/config.yaml), before anything is loaded."""
    integer(cfg.get("warmup", 0), "warmup", low=0)
    threads_setting(cfg.get("threads", "auto"))
    integer(cfg.get("repeats", 1), "repeats", low=1)
    integer(cfg.get("batch_size", 1), "batch_size", low=1)
    engine_compile(cfg)
    boolean(cfg.get("remeasure", False), "remeasure")
    boolean(cfg.get("trace", False), "trace")
    boolean(cfg.get("resume_any_version", False), "resume_any_version")
    stop_strings(cfg.get("stop_strings"), "stop_strings")
    choice(cfg.get("on_long_prompt", "error"), "on_long_prompt", ON_LONG_PROMPT)
    choice(cfg.get("progress", "auto"), "progress", ("auto", True, False, None))
    text(cfg.get("device", "auto"), "device")


BUDGET_KEY = "max_new_tokens"  # the dataset's new-token budget (max_new_tokens below): the runner's, not an evaluator option


def max_new_tokens(decode: dict, dataset: dict) -> int:
    """A run's new-token budget: decode.max_new_tokens when set (an explicit choice wins), else (null) the dataset's own
    (dataset.max_new_tokens: long enough for real models' answers); an error naming both keys when neither is set."""
    explicit = integer(decode.get(BUDGET_KEY), f"decode.{BUDGET_KEY}", low=1, null=True)
    if explicit is not None:
        return explicit
    own = integer(dataset.get(BUDGET_KEY), f"dataset.{BUDGET_KEY}", low=1, null=True)
    if own is None:
        raise OptionError(f"no new-token budget: decode.{BUDGET_KEY} is null (= the dataset's) and dataset "
                          f"{dataset.get('name')!r} sets no {BUDGET_KEY}; set one of them, e.g. "
                          f"decode.{BUDGET_KEY}=256 or dataset.{BUDGET_KEY}=256")
    return own
