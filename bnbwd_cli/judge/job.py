"""What one pair's comparison takes besides its arrays: its key names, the settings and its coordinates; and the
Setup and the scaled rule's Accumulator made from them (judge/sets.py's pairs, judge/diff_src.py's pass)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli.judge.compare import Accumulator, Coordinates, Setup
from bnbwd_cli.judge.model import unit_roundoff
from bnbwd_cli.judge.rules import ScaledRule
from bnbwd_cli.judge.tolerance import Judging, comparison_dtype

if TYPE_CHECKING:
    from bnbwd_cli.op import Op


@dataclass(frozen=True)
class Job:
    """What one pair's comparison needs besides the arrays."""

    names: tuple[str, str]
    judging: Judging
    layout: Coordinates

    def setup(self, a: np.ndarray, r: np.ndarray) -> Setup:
        dtype = comparison_dtype(a.dtype, r.dtype)
        return Setup(dtype, self.judging.max_mismatch_for(self.names), self.judging.equal_nan, self.layout,
                     self.judging.top, keep_errors=self.judging.keep_errors, ftz=self.judging.ftz)

    def keeping_errors(self) -> Job:
        """This job with every element's judgement kept (a detail pass for Comparison.errors)."""
        return replace(self, judging=replace(self.judging, keep_errors=True))

    def accumulator(self, a: np.ndarray, r: np.ndarray, inputs: Op, output: str, detailed: bool = True) -> Accumulator:
        """The scaled rule's accumulator of one of the op's outputs."""
        setup = replace(self.setup(a, r), detailed=detailed)
        rule = ScaledRule(self.judging.scaled_for(self.names, unit_roundoff(inputs, setup.dtype), output))
        return Accumulator(a, r, rule, setup)
