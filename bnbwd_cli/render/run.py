"""What `bnbwd run` shows a person: the summary table, the non-finite warning, the progress bar; and RunFacts,
the facts of one run that this module and render/json.py show.

rich is imported where a function uses it: `run -q` renders nothing and never loads it (tests/test_startup.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli.dtypes import dtype_label
from bnbwd_cli.literal import literal

if TYPE_CHECKING:
    from rich.console import Console

    from bnbwd_cli.core.summary import OutputStats


@dataclass(frozen=True)
class RunFacts:
    """One `bnbwd run`: the op's settings as given, its inputs and outputs, where they went, how it ran, and each
    output's statistics (min/max over finite values, NaN/Inf count)."""

    spec: str
    data_format: str
    canonical_format: str
    epsilon: float | None
    training: bool
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    written: list[str]
    elapsed_s: float
    core: str
    stream: bool  # out of core: inputs and diff_src moved by channel blocks
    stats: dict[str, OutputStats]


def progress_bar(console, description: str = "backward"):  # a rich Console
    """A transient rich progress bar on `console` and the callback (done, total) that moves it."""
    from rich.progress import BarColumn, Progress, TimeRemainingColumn

    bar = Progress("[progress.description]{task.description}", BarColumn(), "{task.percentage:>3.0f}%",
                   TimeRemainingColumn(), console=console, transient=True)
    task = bar.add_task(description, total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return bar, update


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
        table.add_row(name, str(array.shape), dtype_label(array.dtype), f"{stats.minimum:.6g}", f"{stats.maximum:.6g}",
                      str(stats.nonfinite))
    src = facts.inputs["src"]
    mode = "training" if facts.training else "inference"
    epsilon = "n/a (variance is invstd)" if facts.epsilon is None else f"{facts.epsilon:g}"
    console.print(
        f"bnbwd run: src {src.shape} {dtype_label(src.dtype)} {facts.data_format} ({facts.canonical_format}), "
        f"spec {literal(facts.spec)}, {mode}, epsilon {epsilon}, {facts.core} core{', streamed' if facts.stream else ''}, "
        f"{facts.elapsed_s * 1e3:.1f} ms",
        markup=False,
        soft_wrap=True,
    )
    console.print(table)
    if facts.written:
        console.print("wrote " + ", ".join(literal(path) for path in facts.written), markup=False, soft_wrap=True)
