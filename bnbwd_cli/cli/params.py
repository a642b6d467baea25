"""Every click ParamType and the option decorators commands share: validation at the edge gives exit 2."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click

from bnbwd_cli.judge.tolerance import DEFAULT_MAX_UNITS, SUM_MAX_UNITS, Judging, MaxMismatch, PerOutput
from bnbwd_cli.layout import FORMAT_ALIASES
from bnbwd_cli.spec import OUTPUT_NAMES, PROFILES

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}  # every command's and the group's


class ArraySource(click.ParamType):
    """FILE.npy, FILE.npz:key, FILE.npz (one array), FILE.safetensors[:key], raw:DTYPE:SHAPE:FILE or '-' for stdin."""

    name = "PATH"

    def convert(self, value, param, ctx):  # click's signature
        if not isinstance(value, str) or not value:
            self.fail("expected FILE.npy, FILE.npz:key, FILE.safetensors:key, raw:DTYPE:SHAPE:FILE or -", param, ctx)
        return value


# Tiles under this budget cost more in per-call overhead than they gain (`--block-size 1` took minutes for a
# 2 MB problem): smaller values are raised to it.
MIN_BLOCK_BYTES = 64 << 10


# Counts and sizes take at most this many digits: a 5,000-digit value passed Python's int() limit (4300 digits) as a
# ValueError, exit 4; no size or shard count needs more than 18 (under 2**63).
MAX_DIGITS = 18


class ByteSize(click.ParamType):
    """A size such as 4096, 512K, 8M or 1G; values under `minimum` are raised to it."""

    name = "SIZE"
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

    def __init__(self, minimum: int = 1) -> None:
        self.minimum = minimum

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return max(value, self.minimum)
        match = re.fullmatch(rf"\s*(\d{{1,{MAX_DIGITS}}})\s*([KMG]?)(I?B)?\s*", str(value).upper())
        if not match or int(match.group(1)) <= 0:
            self.fail(f"{value!r} is not a size such as 4096, 512K or 8M", param, ctx)
        return max(int(match.group(1)) * self.units[match.group(2)], self.minimum)


class OutputList(click.ParamType):
    """Comma-separated output names, e.g. diff_src,diff_gamma."""

    name = "NAMES"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        names = tuple(part.strip() for part in str(value).split(",") if part.strip())
        unknown = [name for name in names if name not in OUTPUT_NAMES]
        if unknown or not names:
            self.fail(f"{value!r}: expected a comma-separated subset of {', '.join(OUTPUT_NAMES)}", param, ctx)
        return tuple(name for name in OUTPUT_NAMES if name in names)


FORMAT_CHOICE = click.Choice(list(FORMAT_ALIASES), case_sensitive=False)


class ToleranceValue(click.ParamType):
    """``VALUE`` (all outputs) or ``NAME=VALUE`` (one output); VALUE a finite number >= 0."""

    name = "[NAME=]VALUE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str | None, float]:
        if isinstance(value, tuple):
            return value
        name, _, number = _split_name(self, value, param, ctx)
        try:
            parsed = float(number)
        except ValueError:
            self.fail(f"{value!r}: {number!r} is not a number (expected VALUE or NAME=VALUE)", param, ctx)
        if not math.isfinite(parsed) or parsed < 0:
            self.fail(f"{value!r}: must be a finite number >= 0", param, ctx)
        return name, parsed


class MismatchValue(click.ParamType):
    """``N`` elements or ``P%`` of each output, optionally as ``NAME=N`` / ``NAME=P%``."""

    name = "[NAME=]N|P%"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str | None, MaxMismatch]:
        if isinstance(value, tuple):
            return value
        name, _, number = _split_name(self, value, param, ctx)
        percent = number.endswith("%")
        text = number[:-1] if percent else number
        try:
            parsed = float(text) if percent else int(text)
        except ValueError:
            self.fail(f"{value!r}: expected a count (e.g. 5) or a percentage (e.g. 0.01%)", param, ctx)
        if not 0 <= parsed <= (100 if percent else math.inf) or not math.isfinite(parsed):
            self.fail(f"{value!r}: a count must be >= 0, a percentage in [0, 100]", param, ctx)
        return name, MaxMismatch(float(parsed), percent)


class KeyPair(click.ParamType):
    """``THEIRS=OURS``: a file's key and the name bnbwd gives it (in every file a command reads)."""

    name = "THEIRS=OURS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        # split at the last "=": OURS is bnbwd's name for an array (never holds "="), THEIRS any key a file holds,
        # "=" included (dx=0=diff_src, as the missing-output message suggests it)
        actual, sep, reference = value.rpartition("=")
        if not sep or not actual or not reference:
            self.fail(f"{value!r}: expected THEIRS=OURS, e.g. dx=diff_src or dy=diff_dst", param, ctx)
        return actual, reference


class ShardValue(click.ParamType):
    """``K/N``: the K-th of N shards (1 <= K <= N)."""

    name = "K/N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[int, int]:
        if isinstance(value, tuple):
            return value
        match = re.fullmatch(rf"\s*(\d{{1,{MAX_DIGITS}}})\s*/\s*(\d{{1,{MAX_DIGITS}}})\s*", str(value))
        if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
            self.fail(f"{value!r}: expected K/N with 1 <= K <= N, e.g. 1/4", param, ctx)
        return int(match.group(1)), int(match.group(2))


def _split_name(ptype: click.ParamType, value: str, param, ctx) -> tuple[str | None, str, str]:
    name, sep, number = str(value).rpartition("=")
    if sep and not name:
        ptype.fail(f"{value!r}: empty output name before '='", param, ctx)
    return (name or None), sep, number


def _per_output(values: tuple[tuple[str | None, Any], ...]) -> PerOutput:
    """Repeated ``[NAME=]VALUE`` options: the last global and the last per name win."""
    default, by_name = None, {}
    for name, value in values:
        if name is None:
            default = value
        else:
            by_name[name] = value
    return PerOutput(default, by_name)


def _names(values: tuple[str, ...]) -> tuple[str, ...]:
    """--only/--ignore accept repeats and comma-separated lists."""
    return tuple(n.strip() for v in values for n in v.split(",") if n.strip())


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class ComparisonOptions:
    """Everything the comparison options hold, parsed: what the comparison takes (judging) and how the
    report looks."""

    judging: Judging = field(default_factory=Judging)
    data_format: str | None = None
    verbose: bool = False
    brief: bool = False
    save_error: str | None = None  # --save-error FILE.npz: every element's judgement, per output


_OPTION_KEYS = ("atol", "rtol", "ulp", "rel_l2", "max_mismatch", "max_units", "bias_check", "ftz", "equal_nan", "key_map", "only",
                "ignore", "verbose", "brief", "top")


SAVE_ERROR_HELP = ("Also write every element's judgement to FILE.npz, per output in its own shape: OUTPUT.failing and "
                   "OUTPUT.nonfinite (bool), OUTPUT.ratio (error / allowance, > 1 fails) and, judged by the error model, "
                   "OUTPUT.units (float32, NaN where a side is not finite). Exit code unchanged.")


def _option_list(with_format: bool, with_json: bool) -> list[Callable]:
    tolerance = ToleranceValue()
    options = [
        click.option("--atol", type=tolerance, multiple=True, help="Absolute tolerance (not scaled by magnitude); VALUE for all outputs or NAME=VALUE for one. Repeatable."),
        click.option("--rtol", type=tolerance, multiple=True, help="Relative tolerance, times |reference|; VALUE or NAME=VALUE. Repeatable."),
        click.option("--ulp", type=tolerance, multiple=True, help="An element also passes within this many ULPs of the output dtype at the reference; VALUE or NAME=VALUE. 0 turns it off."),
        click.option("--rel-l2", "rel_l2", type=tolerance, multiple=True, help="Bound on ||a-r||2/||r||2 per output; VALUE or NAME=VALUE."),
        click.option("--max-mismatch", type=MismatchValue(), multiple=True, help="Failing elements tolerated per output: N or P% (e.g. 0.01%); NAME=... for one output. Default 0."),
        click.option("--max-units", type=tolerance, multiple=True, help=f"With the inputs known: K, the error units (of the problem's own error scale) an element may use. Default {DEFAULT_MAX_UNITS:g} for diff_src, {SUM_MAX_UNITS:g} for diff_gamma and diff_beta; VALUE sets every output, NAME=VALUE one (e.g. diff_beta=4). Repeatable."),
        click.option("--ftz/--no-ftz", default=True, show_default=True, help="An element written as 0 where the reference is subnormal in the output's dtype passes (a kernel built with flush-to-zero: CUDA -ftz, --use_fast_math), counted in a note; --no-ftz fails it (IEEE subnormals)."),
        click.option("--bias-check/--no-bias-check", default=True, show_default=True, help="With the inputs known: fail a systematic scale of actual vs reference far beyond rounding noise."),
        click.option("--equal-nan", is_flag=True, help="NaN in both at the same position passes (otherwise any NaN fails)."),
        click.option("--map", "key_map", type=KeyPair(), multiple=True, help="Read a file's key THEIRS as OURS (e.g. dx=diff_src, dy=diff_dst), in every file the command reads, inputs and outputs alike; the specs' names (x_backprop...) need none. Repeatable."),
        click.option("--only", multiple=True, metavar="KEY[,KEY]", help="Compare only these keys (either side's name)."),
        click.option("--ignore", multiple=True, metavar="KEY[,KEY]", help="Leave these keys out (either side's name)."),
    ]
    if with_format:
        options.append(
            click.option(
                "--format",
                "data_format",
                type=FORMAT_CHOICE,
                default=None,
                help="Layout of the tensors: coordinates read n=.. c=.. h=.. w=.. and a per-channel table is shown. Default: plain indices.",
            )
        )
    options += [
        click.option("-v", "--verbose", is_flag=True, help="Details for every output, not only failing ones."),
        click.option("--brief", is_flag=True, help="One line per output and the verdict."),
        click.option("--top", type=click.IntRange(min=0), default=10, show_default=True, help="Worst elements (and channels) listed per output."),
    ]
    if with_json:
        options.append(click.option("--json", "json_target", metavar="PATH|-", default=None, help="Also write the facts as JSON to PATH; '-' writes only JSON to stdout. Exit code unchanged."))
    return options


save_error_option = click.option("--save-error", "save_error", metavar="FILE.npz", default=None, help=SAVE_ERROR_HELP)


def comparison_options(func: Callable | None = None, *, with_format: bool = True, with_json: bool = True,
                       with_save_error: bool = True) -> Callable:
    """Add the comparison options to a click command; it receives ``comparison: ComparisonOptions``.

    With ``with_json`` the command also receives ``json_target`` (str or None); ``with_save_error`` adds
    --save-error (ComparisonOptions.save_error: one comparison's file, not check's many). Use bare
    (``@comparison_options``) or with arguments (``@comparison_options(with_format=False)``
    when the command has its own ``--format``; run sets its own: ``replace(comparison, data_format=...)``).
    """

    def decorate(f: Callable) -> Callable:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = {key: kwargs.pop(key) for key in _OPTION_KEYS}
            data_format = kwargs.pop("data_format") if with_format else None
            save_error = kwargs.pop("save_error") if with_save_error else None
            kwargs["comparison"] = ComparisonOptions(
                judging=Judging(
                    atol=_per_output(values["atol"]),
                    rtol=_per_output(values["rtol"]),
                    ulp=_per_output(values["ulp"]),
                    rel_l2=_per_output(values["rel_l2"]),
                    max_mismatch=_per_output(values["max_mismatch"]),
                    max_units=_per_output(values["max_units"]),
                    equal_nan=values["equal_nan"], bias_check=values["bias_check"], ftz=values["ftz"],
                    key_map=dict(values["key_map"]),
                    only=_names(values["only"]),
                    ignore=_names(values["ignore"]),
                    top=values["top"],
                ),
                data_format=data_format,
                verbose=values["verbose"],
                brief=values["brief"],
                save_error=save_error,
            )
            return f(*args, **kwargs)

        for option in reversed(_option_list(with_format, with_json) + ([save_error_option] if with_save_error else [])):
            wrapper = option(wrapper)
        return wrapper

    return decorate(func) if func is not None else decorate


@dataclass(frozen=True)
class ReportTargets:
    """Where a suite's reports go (check and report): --json, --junit, --markdown (a path, '-' for stdout, or
    None), and -q (only the lines of cases that did not pass, and the summary)."""

    json: str | None = None
    junit: str | None = None
    markdown: str | None = None
    quiet: bool = False

    def __post_init__(self) -> None:
        """A name that resolves to stdout (/dev/stdout, /dev/fd/1, /proc/self/fd/1) is stdout, as '-' is."""
        from bnbwd_cli.files.through import is_stdout
        for option in ("json", "junit", "markdown"):
            target = getattr(self, option)
            if target is not None and target != "-" and is_stdout(target):
                object.__setattr__(self, option, "-")

    @property
    def named(self) -> dict[str, str]:
        """{option: target} for the reports asked for."""
        return {option: target for option, target in (("--json", self.json), ("--junit", self.junit),
                                                       ("--markdown", self.markdown)) if target is not None}

    @property
    def wanted(self) -> bool:
        return bool(self.named)

    @property
    def stdout_taken(self) -> bool:
        """A report goes to stdout: the lines go to stderr."""
        return "-" in self.named.values()


def report_file_options(f: Callable) -> Callable:
    """--junit and --markdown: a verdict as CI's reports (check and report: a suite's cases; run --reference and
    verify: one case, the kernel's); the command receives junit_target and markdown_target."""
    for option in reversed((
        click.option("--junit", "junit_target", metavar="PATH|-", default=None,
                     help="Also write JUnit XML to PATH (one testcase per case, run --reference and verify: the "
                     "kernel's file; a mismatch is a failure, a case that cannot be judged an error); '-' writes it "
                     "to stdout. Exit code unchanged."),
        click.option("--markdown", "markdown_target", metavar="PATH|-", default=None,
                     help="Also write a markdown summary to PATH (the failing cases with verdict and hint, then the "
                     "counts; e.g. $GITHUB_STEP_SUMMARY or a pull request's comment); '-' writes it to stdout."),
    )):
        f = option(f)
    return f


def report_options(f: Callable) -> Callable:
    """--junit, --markdown and -q of a suite's report (--json is comparison_options'); the command receives
    junit_target, markdown_target and quiet."""
    for option in reversed((
        report_file_options,
        click.option("-q", "--quiet", is_flag=True, help="Print only the FAIL and ERROR lines and the summary."),
    )):
        f = option(f)
    return f


fsync_option = click.option(
    "--fsync", is_flag=True,
    help="fsync each output file and its directory before the command ends (survives a power loss; slower). "
    "Without it outputs are still atomic: complete under their name, or absent.")


# The options that describe the op, one definition each: `run` declares them among its own, `check` takes them all
# (op_options) as the defaults for cases that do not say.
epsilon_option = click.option("--epsilon", type=float,
                              help="Added to the variance (tensorflow default 1e-4; others: required).")
format_option = click.option("--format", "data_format", type=FORMAT_CHOICE,
                             help="Layout: NCX or NXC, or an alias (NC, NCW, NWC, NCHW, NHWC, NCDHW, NDHWC).  "
                             "[default: the spec's]")
spec_option = click.option("--spec", type=click.Choice(list(PROFILES)), default="generic", show_default=True,
                           help="Whose defaults and dtype rules apply.")
inference_option = click.option("--inference", is_flag=True,
                                help="TF is_training=False: diff_src = gamma*invstd*diff_dst.")
invstd_option = click.option("--variance-is-invstd", is_flag=True,
                             help="variance holds 1/sqrt(var+eps) (cuDNN reserve space); epsilon unused.")
bf16_option = click.option("--bf16", "bf16_keys", multiple=True, metavar="KEY",
                           help="Read KEY's 2-byte raw data (int16/uint16 bits) as bfloat16: an input (src, diff_dst, "
                           "...) or, with --reference, a key of KERNEL_OUT. Repeatable.")


def op_options(f: Callable) -> Callable:
    """All six, in run's order."""
    for option in reversed((epsilon_option, format_option, spec_option, inference_option, invstd_option, bf16_option)):
        f = option(f)
    return f
