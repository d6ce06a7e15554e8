"""What one `torch.compile(backend="neuron", mode=..., options=...)` call asks for, resolved with TorchNeuron's
environment variables. Read once per compiled graph, so tests and users can change the environment between
compiles."""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import envvars

__all__ = ["CompileSettings", "default_cache_dir"]

# The `options` keys this backend reads; anything else is a mistake worth reporting.
KNOWN_OPTIONS = ("model_name", "fallback_execution")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def default_cache_dir() -> Path:
    """The persistent compile cache when `TORCH_NEURONX_NEFF_CACHE_DIR` is unset: under the user cache dir."""
    base = envvars.XDG_CACHE_HOME.read() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "neuron-compile"


@dataclasses.dataclass(frozen=True)
class CompileSettings:
    """Resolved settings of one compile."""

    mode: str
    model_name: str | None
    fallback_execution: bool
    autocopy: bool
    debug_dir: Path | None
    cache_dir: Path | None  # None: the persistent cache is disabled
    lock_timeout: float

    @classmethod
    def resolve(cls, mode: str | None = None, options: Mapping[str, Any] | None = None) -> CompileSettings:
        """Validate `mode` and `options` (warning for a non-default mode, as TorchNeuron does) and read the env."""
        mode = mode or "default"
        if not isinstance(mode, str):
            raise TypeError(f'torch.compile(backend="neuron"): mode must be a string, got {mode!r}')
        if mode != "default":
            warnings.warn(
                f'torch.compile(backend="neuron") supports only mode="default"; mode={mode!r} is ignored and the '
                "graph is compiled with the default mode.",
                UserWarning,
                stacklevel=3,
            )
        options = dict(options or {})
        unknown = sorted(set(options) - set(KNOWN_OPTIONS))
        if unknown:
            raise ValueError(
                f'torch.compile(backend="neuron"): unknown option(s) {unknown}; the backend reads {list(KNOWN_OPTIONS)}'
            )
        model_name = options.get("model_name")
        if model_name is not None and (not isinstance(model_name, str) or not _MODEL_NAME.match(model_name)):
            raise ValueError(
                f"options['model_name'] must be 1-128 characters of letters, digits, '_', '-' or '.', got {model_name!r}"
            )
        fallback = options.get("fallback_execution")
        if fallback is None:
            fallback = not envvars.FALLBACK_DISABLED.read()
        elif not isinstance(fallback, bool):
            raise TypeError(f"options['fallback_execution'] must be a bool, got {fallback!r}")
        debug_dir = None
        if envvars.DEBUG_DIR.is_set() and envvars.PRESERVE_ARTIFACTS.read():
            debug_dir = Path(envvars.DEBUG_DIR.read())
        cache_dir = None
        if not envvars.CACHE_DISABLED.read():
            cache_dir = Path(envvars.CACHE_DIR.read() or default_cache_dir())
        lock_timeout = envvars.CACHE_LOCK_TIMEOUT.read()
        return cls(
            mode=mode,
            model_name=model_name,
            fallback_execution=fallback,
            autocopy=not envvars.AUTOCOPY_DISABLED.read(),
            debug_dir=debug_dir,
            cache_dir=cache_dir,
            lock_timeout=lock_timeout,
        )

    def cache_fields(self) -> dict[str, Any]:
        """The options that are part of the cache key (`mode` is not: every mode compiles as "default")."""
        return {"model_name": self.model_name, "autocopy": self.autocopy}
