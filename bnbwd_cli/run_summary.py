"""What `bnbwd run` tells the person or the script that ran it: a rich table, warnings, JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli.core.stats import OutputStats
from bnbwd_cli.core.stats import scan as output_stats  # the fallback for outputs that come without their stats
from bnbwd_cli.files.read import dtype_name

if TYPE_CHECKING:  # rich is imported only when a summary is rendered (`run -q` never loads it)
    from rich.console import Console

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class RunFacts:
    spec: str
    data_format: str
    canonical_format: str
    epsilon: float | None
    training: bool
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    written: list[str]
    elapsed_s: float
    core: str = "numpy"  # the core that ran
    stream: bool = False  # out of core: inputs and diff_src moved by channel blocks
    stats: dict[str, OutputStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Outputs the core made come with their stats (BackwardResult.stats); the others are scanned here.
        self.stats.update({name: output_stats(array) for name, array in self.outputs.items() if name not in self.stats})


def nonfinite_warning(facts: RunFacts) -> str | None:
    bad = {name: s.nonfinite for name, s in facts.stats.items() if s.nonfinite}
    if not bad:
        return None
    listing = ", ".join(f"{name} {count}" for name, count in bad.items())
    return (f"warning: non-finite outputs ({listing} NaN/Inf values): NaN/Inf in an input propagate "
            "through its channel's sums into every output of that channel, as in the frameworks")


def render_run(console: Console, error_console: Console, facts: RunFacts) -> None:
    from rich.table import Table

    warning = nonfinite_warning(facts)
    if warning:
        error_console.print(warning, style="yellow", markup=False, soft_wrap=True)  # one line: log greps
    table = Table(title=None, show_edge=False, header_style="bold")
    for column in ("output", "shape", "dtype", "min", "max", "NaN/Inf"):
        table.add_column(column, justify="left" if column in ("output", "dtype") else "right")
    for name, array in facts.outputs.items():
        stats = facts.stats[name]
        table.add_row(name, str(array.shape), dtype_name(array.dtype), f"{stats.minimum:.6g}", f"{stats.maximum:.6g}",
                      str(stats.nonfinite))
    src = facts.inputs["src"]
    mode = "training" if facts.training else "inference"
    epsilon = "n/a (variance is invstd)" if facts.epsilon is None else f"{facts.epsilon:g}"
    console.print(
        f"bnbwd run: src {src.shape} {dtype_name(src.dtype)} {facts.data_format} ({facts.canonical_format}), "
        f"spec {facts.spec}, {mode}, epsilon {epsilon}, {facts.core} core{', streamed' if facts.stream else ''}, "
        f"{facts.elapsed_s * 1e3:.1f} ms",
        markup=False,
        soft_wrap=True,
    )
    console.print(table)
    if facts.written:
        console.print("wrote " + ", ".join(facts.written), markup=False)


def run_json(facts: RunFacts) -> str:
    import json  # here: `run` without --json need not load it

    document = {
        "schema_version": SCHEMA_VERSION,
        "command": "run",
        "spec": facts.spec,
        "data_format": facts.data_format,
        "canonical_format": facts.canonical_format,
        "epsilon": facts.epsilon,
        "training": facts.training,
        "elapsed_s": facts.elapsed_s,
        "core": facts.core,
        "stream": facts.stream,
        "inputs": {name: _describe(array) for name, array in facts.inputs.items()},
        "outputs": {
            name: {**_describe(array), "min": _finite_or_none(facts.stats[name].minimum),
                   "max": _finite_or_none(facts.stats[name].maximum), "nonfinite": facts.stats[name].nonfinite}
            for name, array in facts.outputs.items()
        },
        "written": facts.written,
    }
    return json.dumps(document, indent=2)


def _describe(array: np.ndarray) -> dict:
    return {"shape": list(array.shape), "dtype": dtype_name(array.dtype)}


def _finite_or_none(value: float) -> float | None:
    return value if np.isfinite(value) else None
