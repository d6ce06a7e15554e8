"""Environment variables: how a package declares one it reads, and the one parser of their values.

Each package lists every variable it reads in its own declarations module (``neuron_device/envvars.py``,
``neuron_compile/envvars.py``, ``neuron_distributed/envvars.py``, ``nki/envvars.py``; the machine's variables in
``neuron_spec/machine.py``), as `EnvVar` constants, and reads them only through `EnvVar.read`. The docs table
``docs/environment-variables.md`` is checked against those declarations (``tests/test_docs_env_vars.py``).

Why one parser: the packages used to spell a boolean four ways (``NEURON_DEVICE_STRICT_PLUGINS=true`` was silently
off while other flags accepted it). Every boolean now accepts 1/0, true/false, yes/no, on/off (any case); an empty
value is the default; anything else raises `EnvVarError` naming the variable and the accepted forms.

To declare a variable, add to your package's declarations module::

    MY_FLAG = EnvVar("NEURON_MY_FLAG", bool, False, "1: do the thing (why a user would set it)")

and read it with ``envvars.MY_FLAG.read()`` where it is needed (at import for a value fixed per process, per call
for one tests may change). Then add its row to ``docs/environment-variables.md``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BOOL_FORMS", "EnvVar", "EnvVarError", "parse_bool", "unknown_names"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
BOOL_FORMS = "0 or 1 (also accepted: false/true, no/yes, off/on)"


class EnvVarError(ValueError, RuntimeError):
    """An environment variable has a value its declaration does not accept.

    Both a ValueError and a RuntimeError: the packages raised one or the other for bad settings before they shared
    this parser, and callers catch either."""


def parse_bool(name: str, raw: str) -> bool:
    """The boolean spelled by `raw` (see the module docstring); `name` names the variable in the error."""
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise EnvVarError(f"{name}={raw!r} is invalid: must be {BOOL_FORMS}")


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise EnvVarError(f"{name}={raw!r} is invalid: must be an integer") from None


def _parse_float(name: str, raw: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        raise EnvVarError(f"{name}={raw!r} is invalid: must be a number") from None


_PARSERS: dict[type, Callable[[str, str], Any]] = {
    bool: parse_bool,
    int: _parse_int,
    float: _parse_float,
    str: lambda name, raw: raw.strip(),
}


@dataclass(frozen=True)
class EnvVar:
    """One environment variable a package reads: its name, the type of its value, the default when it is unset
    or empty, and what it does (the docs table's text says the same).

    `type` is bool, int, float or str. `choices` restricts a str variable to these values (compared lower-case);
    `minimum` bounds an int or float one. `owner` is the package that reads it (the docs table's second column).
    """

    name: str
    type: type
    default: Any
    doc: str
    owner: str = "device"
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    _key: Any = field(init=False, repr=False, compare=False)  # the name as `os.environ` stores it (`raw`)

    def __post_init__(self) -> None:
        if self.type not in _PARSERS:
            raise TypeError(f"EnvVar {self.name}: type must be one of {sorted(t.__name__ for t in _PARSERS)}")
        object.__setattr__(self, "_key", os.environ.encodekey(self.name))

    def raw(self, env: Mapping[str, str] | None = None) -> str | None:
        """The variable's text as set (blank included), or None when it is unset.

        The process environment is read as `os.environ.get` reads it, minus that call's generic steps (`Mapping.get`,
        the name encoded, a KeyError raised and caught when unset): some variables are read at every call of a
        kernel (neuron-nki's native-kernel mode, twice a tiny Llama forward), right after kernels that evicted the
        host's caches. `os.environ` keeps the environment by encoded name in `_data`, updated at every set and unset.
        """
        if env is None:
            environ = os.environ
            if type(environ) is not os._Environ:  # a test put another mapping in its place
                return environ.get(self.name)
            value = environ._data.get(self._key)
            return None if value is None else environ.decodevalue(value)
        return env.get(self.name)

    def is_set(self, env: Mapping[str, str] | None = None) -> bool:
        """Whether the variable is set to a non-blank value."""
        raw = self.raw(env)
        return raw is not None and bool(raw.strip())

    def read(self, env: Mapping[str, str] | None = None) -> Any:
        """The parsed value in `env` (default: the process environment), or the default when unset or blank."""
        if not self.is_set(env):
            return self.default
        raw = self.raw(env)
        value = _PARSERS[self.type](self.name, raw)
        if self.choices and value.lower() not in self.choices:
            raise EnvVarError(f"{self.name}={raw!r} is invalid. Accepted: {', '.join(self.choices)}.")
        if self.minimum is not None and value < self.minimum:
            raise EnvVarError(f"{self.name}={raw!r} is invalid: use a value >= {self.minimum:g}")
        return value.lower() if self.choices else value

    @contextlib.contextmanager
    def overridden(self, value: str) -> Iterator[None]:
        """Set the variable to `value` in the process environment for a block, then restore it (or unset it)."""
        saved = os.environ.get(self.name)
        os.environ[self.name] = value
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop(self.name, None)
            else:
                os.environ[self.name] = saved


def unknown_names(known: set[str], prefixes: tuple[str, ...],
                  env: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """Set variables whose name has one of `prefixes` but is not in `known` (a typo, most likely), each with the
    closest known name (None when nothing is close), sorted."""
    import difflib

    names = sorted(name for name in (os.environ if env is None else env)
                   if name.startswith(prefixes) and name not in known)
    return [(name, next(iter(difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)), None))
            for name in names]
