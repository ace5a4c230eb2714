"""One pattern for every kind of named extension: policies, trace formats, model factors, executors.

A :class:`Registry` maps names to things of one kind.  Built-in ones register themselves where they
are defined, and the registry imports every module of its home package on first use, so there is no
list of imports to keep.  Outside code plugs in without editing gpuloom, in two ways:

* an entry point in the registry's group (``gpuloom.policies``, ``gpuloom.traces``,
  ``gpuloom.factors``, ``gpuloom.executors``) in its package's metadata: ``name = "module:attr"``
  registers ``attr`` under ``name``; one that names a module is imported, so that the module's own
  registrations run;
* ``module:attr`` where a name is asked for (``--order mylab.orders:Fairest``): imported on the spot.

A plugin that fails to load, or that takes a name already taken, is reported (a warning naming the
entry point) and skipped: one broken package does not take the built-ins with it.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import warnings
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from importlib.metadata import entry_points
from types import MappingProxyType, ModuleType
from typing import Any, Generic, TypeVar

STAGES = ("order", "group", "size", "place", "queue")
#: the policy each stage takes when none is named (commands, run configurations, Stack, Scheduler)
STAGE_DEFAULTS: Mapping[str, str] = MappingProxyType(
    {"order": "fifo", "group": "none", "size": "proportional", "place": "packed-sticky", "queue": "none"})

T = TypeVar("T")


class RegistryError(ValueError):
    """An unknown name, or a plugin that is not what its registry holds."""


class Registry(Mapping[str, T], Generic[T]):
    """Names -> things of one ``kind`` (see the module notes); a read-only mapping of what is registered.

    ``home``: the package whose modules register the built-ins; ``group``: the entry point group;
    ``check(obj, where)``: returns ``obj`` as the registry holds it, or raises :class:`RegistryError`
    saying what is wrong with it (``where`` names its origin); ``accepts(obj)``: whether an entry
    point's object belongs here (registries sharing one group, such as the policy stages);
    ``named(held, name)``: told the first name a thing is registered or looked up under.
    """

    def __init__(self, kind: str, home: str | None = None, group: str | None = None,
                 check: Callable[[Any, str], T] | None = None, accepts: Callable[[Any], bool] | None = None,
                 named: Callable[[T, str], None] | None = None, outside: str = "module:attr",
                 error: type[ValueError] = RegistryError) -> None:
        self.kind, self.home, self.group = kind, home, group
        self._check = check
        self._accepts = accepts
        self._named = named
        self.outside = outside  # how a user writes an outside name (in error messages)
        self.error = error
        self._items: dict[str, T] = {}
        self._outside: dict[str, T] = {}  # module:attr names looked up so far
        self._loaded = False

    # -- registering ------------------------------------------------------------------------------
    def add(self, obj: Any, *names: str, where: str = "") -> T:
        """Register ``obj`` under ``names`` (checked as this registry holds it) and return it."""
        held = self._checked(obj, where or _origin(obj))
        for n in names:
            if not n or ":" in n or any(c.isspace() for c in n):
                raise self.error(f"{self.kind} name {n!r}: a name is non-empty, without ':' or spaces")
            self._items[n] = held
        if self._named is not None and names:
            self._named(held, names[0])
        return held

    def register(self, *names: str) -> Callable[[Any], Any]:
        """Decorator: register the decorated object under ``names``."""
        if not names:
            raise self.error(f"register a {self.kind} under at least one name")

        def deco(obj: Any) -> Any:
            self.add(obj, *names)
            return obj

        return deco

    # -- looking up -------------------------------------------------------------------------------
    def lookup(self, name: str) -> T:
        """The thing registered as ``name``, or ``module:attr`` imported; a clear error otherwise."""
        self.load()
        hit = self._items.get(name)
        if hit is not None:
            return hit
        if ":" in name:
            return self._import(name)
        raise self.error(f"unknown {self.kind} {name!r}{did_you_mean(name, self._items)} "
                         f"(choose from: {', '.join(sorted(self._items))}; or {self.outside})")

    def load(self) -> None:
        """Import the home package's modules and the entry points of the group (once)."""
        if self._loaded:
            return
        self._loaded = True  # (set first: the modules imported below register into this registry)
        if self.home is not None:
            try:
                _import_package(self.home)
            except BaseException:
                self._loaded = False
                raise
        if self.group is not None:
            for ep_name, value, obj in _entry_points(self.group):
                if isinstance(obj, ModuleType) or (self._accepts is not None and not self._accepts(obj)):
                    continue
                where = f"entry point {ep_name} = {value} (group {self.group})"
                if self._items.get(ep_name) is obj:  # (its module registered it under this name)
                    continue
                if ep_name in self._items:
                    warnings.warn(f"{where}: {self.kind} {ep_name!r} is already registered; ignored", stacklevel=2)
                    continue
                try:
                    self.add(obj, ep_name, where=where)
                except ValueError as e:
                    msg = str(e) if where in str(e) else f"{where}: {e}"
                    warnings.warn(f"{msg}; ignored", stacklevel=2)

    def _import(self, spec: str) -> T:
        hit = self._outside.get(spec)
        if hit is not None:
            return hit
        module, _, attr = spec.partition(":")
        if not module or not attr:
            raise self.error(f"{self.kind} {spec!r}: give {self.outside}")
        try:
            obj: Any = importlib.import_module(module)
        except ImportError as e:
            raise self.error(f"{self.kind} {spec!r}: cannot import {module!r}: {e}") from None
        for part in attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise self.error(f"{self.kind} {spec!r}: module {module!r} has no {attr!r}") from None
        held = self._checked(obj, spec)
        if self._named is not None:
            self._named(held, spec)
        self._outside[spec] = held
        return held

    def _checked(self, obj: Any, where: str) -> T:
        if self._check is None:
            return obj
        try:
            return self._check(obj, where)
        except RegistryError as e:
            raise self.error(str(e)) from None

    # -- the mapping (what is registered; loads first) ---------------------------------------------
    def __getitem__(self, name: str) -> T:
        self.load()
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        self.load()
        return iter(list(self._items))

    def __len__(self) -> int:
        self.load()
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        self.load()
        return name in self._items


def did_you_mean(word: str, choices: Any, quote: str = "'") -> str:
    """``"; did you mean 'srtf'?"`` for the closest choices (difflib), else ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=2, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + " or ".join(f"{quote}{c}{quote}" for c in close) + "?"


def _origin(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', type(obj).__name__)}"


def _import_package(name: str) -> None:
    """Import every module of package ``name`` (their registrations run)."""
    pkg = importlib.import_module(name)
    for info in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{name}.{info.name}")


@cache
def _entry_points(group: str) -> tuple[tuple[str, str, Any], ...]:
    """(name, value, loaded object) of each entry point of ``group`` that loads; the others are reported."""
    out = []
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        try:
            out.append((ep.name, ep.value, ep.load()))
        except Exception as e:  # noqa: BLE001 (any error in outside code: report it, keep the built-ins)
            warnings.warn(f"entry point {ep.name} = {ep.value} (group {group}) failed to load: "
                          f"{type(e).__name__}: {e}; ignored", stacklevel=3)
    return tuple(out)
