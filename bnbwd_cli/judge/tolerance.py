"""What an output must satisfy: fixed dtype tolerances, or K units of the problem's error scale.

Two ways to judge an element, chosen per output:

- **scaled** (the inputs are known: ``run --reference``, ``verify --inputs``): the error model in
  ``judge/model.py`` gives every element a scale ``s`` (what a correct kernel's accumulation may
  cost there); the element passes when ``|a - r| <= K*s + ulp_D(r)`` (one ulp of the output dtype
  for the rounding of both sides). Its error *in units* is ``max(0, |a - r| - ulp_D(r)) / s``.
- **fixed** (no inputs, or the user gave ``--atol/--rtol/--ulp``): ``|a - r| <= atol + rtol*|r|``
  or within ``ulp`` ULPs, plus a relative-L2 gate over the whole output.

ULPs are always those of ``D``, the coarser dtype of the two sides (``dtypes.ulp_spacing``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bnbwd_cli.dtypes import coarser, dtype_name

# K: how many units of the error scale a correct kernel may use. Calibrated on the kernel zoo
# (docs/tolerances.md): the worst correct kernel used 2.1 units, the mildest planted bug that
# shows element-wise used 60; 16 leaves ~8x either side.
DEFAULT_MAX_UNITS = 16.0
# diff_gamma and diff_beta: their scale is the running partial sums' own error size (judge/model.py). Correct
# float32 sums in 7 orders used at most 2.43 units over 1000 seeds each (element-wise atomics in a random
# order; the others < 1), and a lost partial sum of 30-40x a running sum's typical error exceeded 5 units
# in 99.1-100% of the kernels (tools/calibrate_sums.py, docs/tolerances.md).
SUM_MAX_UNITS = 5.0
SUM_OUTPUTS = ("diff_gamma", "diff_beta")


def default_max_units(output: str | None) -> float:
    """K for one of the op's outputs (canonical name) when the user sets none."""
    return SUM_MAX_UNITS if output in SUM_OUTPUTS else DEFAULT_MAX_UNITS


# A systematic deviation fails when it is this many standard errors from zero and larger than
# BIAS_FLOOR_UNITS unit roundoffs (what a correct kernel's own per-channel roundings can shift).
BIAS_Z = 6.0
BIAS_FLOOR_UNITS = 16.0
# diff_gamma/diff_beta: a common relative scale up to this many times the one a sequential float32
# sum's correlated roundings fit to (judge/model.py) is what a correct kernel can do on such data.
SYSTEMATIC_UNITS = 4.0


def bias_threshold(stderr: float, floor: float) -> float:
    """The threshold a systematic scale estimated with this standard error is held to: BIAS_Z standard errors,
    never below ``floor`` (what a correct kernel's roundings shift it). The one place the rule is written."""
    return max(BIAS_Z * stderr, floor)


@dataclass(frozen=True)
class Tolerance:
    """Fixed tolerances for one output."""

    atol: float
    rtol: float
    ulp: float
    rel_l2: float


def tolerance_text(tol: Tolerance) -> str:
    """One line for reports and `verify --help` (here, not in render/, so that help needs no rich)."""
    return f"atol={tol.atol:g} rtol={tol.rtol:g} ulp={tol.ulp:g} rel_l2={tol.rel_l2:.2g}"


# Why these defaults (used when the inputs are not known):
# - f64: reductions over M elements in a different order differ by ~sqrt(M)*eps relative
#   (~1e-13 at M = 1e6); rtol 1e-9 leaves room for that, atol 1e-12 for cancelled diff_src.
# - f32: torch.testing uses atol 1e-5; rtol 1e-5 (~84 ulp) admits float32 accumulation
#   order differences in diff_src. diff_gamma/diff_beta are sums whose correct error scales with
#   the sum of |terms|, not with the result: judge them with --inputs.
# - f16 / bf16: results are rounded once to the output dtype; two correct kernels disagree
#   by about one rounding (eps = 9.8e-4 / 7.8e-3), rtol ~1 ulp (f16) and 2 ulp (bf16,
#   torch.testing's 1.6e-2), atol at the same scale for values near zero.
# - ulp 1: a one-ulp disagreement is a rounding direction, never a bug.
# - rel_l2 = k * 2**-mantissa_bits: k = 2 for f16/bf16 (final rounding dominates),
#   k = 2**6 for f32 and 2**20 for f64 (accumulation order dominates; consistent with rtol).
_REL_L2_SCALE = {"f64": 2.0**20, "f32": 2.0**6, "f16": 2.0, "bf16": 2.0}
DEFAULT_TOLERANCES: Mapping[str, Tolerance] = {
    "f64": Tolerance(atol=1e-12, rtol=1e-9, ulp=1.0, rel_l2=_REL_L2_SCALE["f64"] * 2.0**-52),
    "f32": Tolerance(atol=1e-5, rtol=1e-5, ulp=1.0, rel_l2=_REL_L2_SCALE["f32"] * 2.0**-23),
    "f16": Tolerance(atol=1e-3, rtol=1e-3, ulp=1.0, rel_l2=_REL_L2_SCALE["f16"] * 2.0**-10),
    "bf16": Tolerance(atol=1e-2, rtol=1.6e-2, ulp=1.0, rel_l2=_REL_L2_SCALE["bf16"] * 2.0**-7),
}


def comparison_dtype(actual, reference) -> str:
    """The dtype whose tolerances and ULP grid apply: the coarser of the two sides."""
    names = [dtype_name(actual), dtype_name(reference)]
    if None in names:
        raise ValueError(f"not comparable: {actual} vs {reference}")
    return coarser(*names)


@dataclass(frozen=True)
class MaxMismatch:
    """How many failing elements an output may have: a count, or a percentage of its size."""

    value: float = 0.0
    percent: bool = False

    def allowed(self, size: int) -> int:
        if self.percent:
            return int(math.floor(size * self.value / 100.0))
        return int(self.value)

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.percent else f"{int(self.value)}"


@dataclass(frozen=True)
class PerOutput:
    """One option's value: a global override and per-output overrides (by either key)."""

    default: object = None
    by_name: Mapping[str, object] = field(default_factory=dict)

    def lookup(self, names: Iterable[str]) -> object:
        for name in names:
            if name in self.by_name:
                return self.by_name[name]
        return self.default


@dataclass(frozen=True)
class Scaled:
    """The scaled rule for one output: K units of the problem's error scale, unit roundoff u."""

    max_units: float
    unit: float  # the accumulation's unit roundoff (2**-24, or 2**-53 for an all-float64 problem)
    bias_check: bool = True


@dataclass(frozen=True)
class Judging:
    """How a set of outputs is compared: the user's overrides (unset values fall back to the defaults above),
    which keys (--map THEIRS=OURS, --only, --ignore) and how many worst elements each report lists.
    cli.params.ComparisonOptions holds one, with how the report looks; here, not in judge/sets.py, so that
    case.py need not load the comparison."""

    atol: PerOutput = field(default_factory=PerOutput)
    rtol: PerOutput = field(default_factory=PerOutput)
    ulp: PerOutput = field(default_factory=PerOutput)
    rel_l2: PerOutput = field(default_factory=PerOutput)
    max_mismatch: PerOutput = field(default_factory=PerOutput)
    max_units: PerOutput = field(default_factory=PerOutput)
    equal_nan: bool = False
    bias_check: bool = True
    # A zero where the reference is subnormal in the output's dtype passes (a kernel built with FTZ: CUDA -ftz,
    # --use_fast_math); --no-ftz fails it, for those who need IEEE subnormals.
    ftz: bool = True
    key_map: Mapping[str, str] = field(default_factory=dict)
    only: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    # The op's outputs (canonical names) the kernel must give, those --only/--ignore select: one it lacks is a
    # structural problem (exit 3), never a silent skip. app/judge.judge_kernel sets it; a plain comparison has none.
    required: tuple[str, ...] = ()
    top: int = 10
    # Every output's details will be read (--json, --verbose): gather them in the judging pass, not in a second
    # pass on first use (verify --json of a 25.7M-element diff_src: one pass over the arrays less).
    details_up_front: bool = False
    # Threads the judging may use (None: as many as the machine offers, app/judge.py decides; None is every
    # layer's "the machine's", core.Settings' too): with two or more, diff_src's bias regression runs beside its
    # judging pass. The numbers are the same either way.
    threads: int | None = None
    # Every element's judgement kept in the details (Details.errors: --save-error), not only the failing masks.
    keep_errors: bool = False

    def tolerance_for(self, names: Sequence[str], dtype: str) -> Tolerance:
        base = DEFAULT_TOLERANCES[dtype]
        values = {}
        for attr in ("atol", "rtol", "ulp", "rel_l2"):
            override = getattr(self, attr).lookup(names)
            values[attr] = getattr(base, attr) if override is None else float(override)
        return Tolerance(**values)

    def fixed_requested(self, names: Sequence[str]) -> bool:
        """Explicit --atol/--rtol/--ulp for this output (or all): they win over the scaled rule."""
        return any(getattr(self, attr).lookup(names) is not None for attr in ("atol", "rtol", "ulp"))

    def scaled_for(self, names: Sequence[str], unit: float, output: str | None = None) -> Scaled:
        """``output``: the op's output these names are (canonical name), for its default K."""
        units = self.max_units.lookup(names)
        return Scaled(default_max_units(output) if units is None else float(units), unit, self.bias_check)

    def max_mismatch_for(self, names: Sequence[str]) -> MaxMismatch:
        value = self.max_mismatch.lookup(names)
        return MaxMismatch() if value is None else value

    def output_names(self) -> dict[str, set[str]]:
        """Option name -> the output names it overrides (to reject names that match nothing)."""
        return {
            attr: set(getattr(self, attr).by_name)
            for attr in ("atol", "rtol", "ulp", "rel_l2", "max_mismatch", "max_units")
            if getattr(self, attr).by_name
        }
