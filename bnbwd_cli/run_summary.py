"""The facts of one `bnbwd run` (shapes, dtypes, output statistics) that render/run.py and render/json.py show."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


STATS_CHUNK = 1 << 20  # elements per chunk: summary statistics never make a full-size temporary


@dataclass(frozen=True)
class OutputStats:
    minimum: float
    maximum: float
    nonfinite: int


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
        # Outputs written by blocks (--stream) come with their stats; the others are scanned here.
        self.stats.update({name: output_stats(array) for name, array in self.outputs.items() if name not in self.stats})


def output_stats(array: np.ndarray) -> OutputStats:
    """Min, max (over finite values) and the count of NaN/Inf, in chunks of float32/float64."""
    flat = array.reshape(-1)
    lowest, highest, nonfinite = np.inf, -np.inf, 0
    for start in range(0, flat.size, STATS_CHUNK):
        chunk = flat[start : start + STATS_CHUNK]
        chunk = chunk.astype(np.float32) if chunk.dtype.itemsize == 2 else chunk
        finite = np.isfinite(chunk)
        nonfinite += int(chunk.size - np.count_nonzero(finite))
        if finite.any():
            values = chunk[finite]
            lowest, highest = min(lowest, float(values.min())), max(highest, float(values.max()))
    return OutputStats(lowest if flat.size else float("nan"), highest if flat.size else float("nan"), nonfinite)
