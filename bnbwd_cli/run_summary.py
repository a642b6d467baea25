"""The facts of one `bnbwd run` (shapes, dtypes, output statistics) that render/run.py and render/json.py show."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bnbwd_cli.core.stats import OutputStats
from bnbwd_cli.core.stats import scan as output_stats  # the fallback for outputs that come without their stats


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


