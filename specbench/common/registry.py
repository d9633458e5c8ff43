"""A registry keyed by config name whose errors list the valid names (as lm-eval's registry does).

A registry may name a plugin package: on the first lookup every module in that package is imported,
so a plugin registers itself by being a file there (`specbench.methods`, `specbench.evaluators`).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import traceback
from pathlib import Path
from typing import Callable, Generic, TypeVar

from specbench.common.errors import UserError


class UnknownNameError(UserError, KeyError):
    """Raised for a name that is not registered; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class PluginError(UserError, ImportError):
    """A plugin module does not import (a syntax error, an exception while it runs); the message names file and line."""


def plugin_error(name: str, err: Exception) -> PluginError:
    """The error for plugin module `name` whose import raised `err`: its file, line and what is wrong there."""
    spec = importlib.util.find_spec(name)
    file = spec.origin if spec is not None and spec.origin else name
    if isinstance(err, SyntaxError):
        where, what = f"{err.filename or file}, line {err.lineno}", f"{type(err).__name__}: {err.msg}"
        code = (err.text or "").rstrip("\n")
        if code.strip():
            indent = len(code) - len(code.lstrip())
            what += f"\n    {code.strip()}" + (f"\n    {' ' * (err.offset - 1 - indent)}^" if err.offset else "")
    else:
        lines = [f.lineno for f in traceback.extract_tb(err.__traceback__) if f.filename == file]
        where, what = f"{file}{f', line {lines[-1]}' if lines else ''}", f"{type(err).__name__}: {err}"
    return PluginError(f"{where}: {what}\nthe plugin module {name} cannot be imported (every module in "
                       f"{Path(file).parent} is imported on the first lookup): fix it, or move it out of that folder")


def import_package(package: str) -> list[str]:
    """Import every module of `package` (not sub-packages' modules); returns their names."""
    pkg = importlib.import_module(package)
    names = [f"{package}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_")]
    for name in names:
        try:
            importlib.import_module(name)
        except UserError:
            raise
        except Exception as err:  # noqa: BLE001 - any error of a plugin file: named with its file and line
            raise plugin_error(name, err) from err
    return names


T = TypeVar("T")


class Registry(Generic[T]):
    """Maps a config name to a T (a class or factory); `plugins` names the package whose modules register."""

    def __init__(self, kind: str, plugins: str | None = None) -> None:
        self.kind = kind
        self.plugins = plugins
        self._items: dict[str, T] = {}
        self._discovered = plugins is None

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return deco

    def discover(self) -> None:
        """Import the plugin package's modules once (each registers what it defines)."""
        if not self._discovered and self.plugins is not None:  # no plugin package: discovered from the start
            self._discovered = True  # before importing: a plugin may look names up while it loads
            try:
                import_package(self.plugins)
            except BaseException:
                self._discovered = False
                raise

    def get(self, name: str) -> T:
        self.discover()
        if name not in self._items:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; valid names: {', '.join(sorted(self._items))}"
            )
        return self._items[name]

    def names(self) -> list[str]:
        self.discover()
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        self.discover()
        return name in self._items
