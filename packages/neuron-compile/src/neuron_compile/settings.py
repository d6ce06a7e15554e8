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

__all__ = ["ENV", "CompileSettings", "default_cache_dir"]

# Every environment variable neuron-compile reads (TorchNeuron's names).
ENV = {
    "fallback": "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION",  # default 1: a compile failure raises
    "autocopy": "TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY",  # 1: CPU inputs are not copied to `neuron`
    "debug_dir": "TORCH_NEURONX_DEBUG_DIR",
    "preserve": "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS",
    "cache_dir": "TORCH_NEURONX_NEFF_CACHE_DIR",
    "disable_cache": "TORCH_NEURONX_NEFF_DISABLE_CACHE",
    "lock_timeout": "TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT",  # seconds to wait for another process's compile
}

# The `options` keys this backend reads; anything else is a mistake worth reporting.
KNOWN_OPTIONS = ("model_name", "fallback_execution")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"environment variable {name}={value!r} must be 0 or 1")


def default_cache_dir() -> Path:
    """The persistent compile cache when `TORCH_NEURONX_NEFF_CACHE_DIR` is unset: under the user cache dir."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
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
            fallback = not _flag(ENV["fallback"], True)
        elif not isinstance(fallback, bool):
            raise TypeError(f"options['fallback_execution'] must be a bool, got {fallback!r}")
        debug_dir = None
        if os.environ.get(ENV["debug_dir"]) and _flag(ENV["preserve"], False):
            debug_dir = Path(os.environ[ENV["debug_dir"]])
        cache_dir = None
        if not _flag(ENV["disable_cache"], False):
            cache_dir = Path(os.environ.get(ENV["cache_dir"]) or default_cache_dir())
        timeout_text = os.environ.get(ENV["lock_timeout"], "600")
        try:
            lock_timeout = float(timeout_text)
        except ValueError:
            raise ValueError(f"{ENV['lock_timeout']}={timeout_text!r} must be a number of seconds") from None
        return cls(
            mode=mode,
            model_name=model_name,
            fallback_execution=fallback,
            autocopy=not _flag(ENV["autocopy"], False),
            debug_dir=debug_dir,
            cache_dir=cache_dir,
            lock_timeout=lock_timeout,
        )

    def cache_fields(self) -> dict[str, Any]:
        """The options that are part of the cache key (`mode` is not: every mode compiles as "default")."""
        return {"model_name": self.model_name, "autocopy": self.autocopy}
