"""Debug artifacts of a compile (`TORCH_NEURONX_DEBUG_DIR` with `TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS=1`):
the FX graphs each stage saw and the host code generated, laid out as TorchNeuron does
(`<debug dir>/fx_graphs/proc_<rank>/...`, `<debug dir>/code/proc_<rank>/...`)."""

from __future__ import annotations

from pathlib import Path

import torch

from . import envvars

__all__ = ["ArtifactWriter"]


def _rank() -> str:
    return envvars.RANK.read()


class ArtifactWriter:
    """Writes the artifacts of one compiled graph under names `<name>_<stage>.*` (no-op without a debug dir)."""

    def __init__(self, debug_dir: Path | None, name: str) -> None:
        self.name = name
        self.graphs = None if debug_dir is None else debug_dir / "fx_graphs" / f"proc_{_rank()}"
        self.code = None if debug_dir is None else debug_dir / "code" / f"proc_{_rank()}"

    def write_graph(self, stage: str, gm: torch.fx.GraphModule) -> None:
        """The readable FX graph at `stage` ("dynamo", "dynamo_regions": the graph AOTAutograd traces when it keeps the
        regions, `aot_regions`; "forward", "backward", "inference")."""
        if self.graphs is not None:
            self.graphs.mkdir(parents=True, exist_ok=True)
            text = gm.print_readable(print_output=False, include_stride=True, include_device=True)
            (self.graphs / f"{self.name}_{stage}.txt").write_text(text)

    def write_code(self, stage: str, source: str | None) -> None:
        """The Python wrapper + C++ kernels Inductor generated for `stage`."""
        if self.code is not None and source is not None:
            self.code.mkdir(parents=True, exist_ok=True)
            (self.code / f"{self.name}_{stage}.py").write_text(source)
