"""A registry keyed by config name whose errors list the valid names (as lm-eval's registry does).

A registry may name a plugin package: on the first lookup every module in that package is imported,
so a plugin registers itself by being a file there (`specbench.methods`, `specbench.evaluators`).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable

from specbench.common.errors import UserError


class UnknownNameError(UserError, KeyError):
    """Raised for a name that is not registered; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def import_package(package: str) -> list[str]:
    """Import every module of `package` (not sub-packages' modules); returns their names."""
    pkg = importlib.import_module(package)
    names = [f"{package}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_")]
    for name in names:
        importlib.import_module(name)
    return names


class Registry:
    """Maps a config name to a class or factory; `plugins` names the package whose modules register."""

    def __init__(self, kind: str, plugins: str | None = None) -> None:
        self.kind = kind
        self.plugins = plugins
        self._items: dict[str, Any] = {}
        self._discovered = plugins is None

    def register(self, name: str) -> Callable[[Any], Any]:
        def deco(obj: Any) -> Any:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return deco

    def discover(self) -> None:
        """Import the plugin package's modules once (each registers what it defines)."""
        if not self._discovered:
            self._discovered = True  # before importing: a plugin may look names up while it loads
            try:
                import_package(self.plugins)
            except BaseException:
                self._discovered = False
                raise

    def get(self, name: str) -> Any:
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
