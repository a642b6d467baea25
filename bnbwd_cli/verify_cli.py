"""`bnbwd verify` and the comparison options `run --reference` shares.

Click parses (custom ParamTypes fail with exit 2), judge/ computes, render/ prints.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from bnbwd_cli.errors import ExitCode
from bnbwd_cli.case import read_inputs
from bnbwd_cli.judge.tolerance import (DEFAULT_MAX_UNITS, DEFAULT_TOLERANCES, CompareSettings, MaxMismatch, PerOutput,
                                       tolerance_text)
from bnbwd_cli.params import FORMAT_CHOICE
from bnbwd_cli.profiles import OUTPUT_NAMES, PROFILES, check_epsilon, validate_inputs
from bnbwd_cli.files import write as files_write
from bnbwd_cli.files.read import read_tensor_set
from bnbwd_cli.files.reinterpret import check_found, reinterpret_bf16

if TYPE_CHECKING:
    from bnbwd_cli.judge.model import BackwardInputs

# The comparison (judge/) and the report (render/, rich) are imported where they are used: `bnbwd run`
# without --reference loads this module for its options only (tests/test_startup.py guards that).

# --------------------------------------------------------------------------- click types


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
        actual, sep, reference = value.partition("=")
        if not sep or not actual or not reference:
            self.fail(f"{value!r}: expected THEIRS=OURS, e.g. dx=diff_src or dy=diff_dst", param, ctx)
        return actual, reference


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
    """Everything the comparison options hold, parsed."""

    settings: CompareSettings = field(default_factory=CompareSettings)
    key_map: Mapping[str, str] = field(default_factory=dict)
    only: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    data_format: str | None = None
    verbose: bool = False
    brief: bool = False
    top: int = 10


_OPTION_KEYS = ("atol", "rtol", "ulp", "rel_l2", "max_mismatch", "max_units", "bias_check", "equal_nan", "key_map", "only",
                "ignore", "verbose", "brief", "top")


def _option_list(with_format: bool, with_json: bool) -> list[Callable]:
    tolerance = ToleranceValue()
    options = [
        click.option("--atol", type=tolerance, multiple=True, help="Absolute tolerance (not scaled by magnitude); VALUE for all outputs or NAME=VALUE for one. Repeatable."),
        click.option("--rtol", type=tolerance, multiple=True, help="Relative tolerance, times |reference|; VALUE or NAME=VALUE. Repeatable."),
        click.option("--ulp", type=tolerance, multiple=True, help="An element also passes within this many ULPs of the output dtype at the reference; VALUE or NAME=VALUE. 0 turns it off."),
        click.option("--rel-l2", "rel_l2", type=tolerance, multiple=True, help="Bound on ||a-r||2/||r||2 per output; VALUE or NAME=VALUE."),
        click.option("--max-mismatch", type=MismatchValue(), multiple=True, help="Failing elements tolerated per output: N or P% (e.g. 0.01%); NAME=... for one output. Default 0."),
        click.option("--max-units", type=tolerance, multiple=True, help=f"With the inputs known: K, the error units (of the problem's own error scale) an element may use; VALUE or NAME=VALUE. Default {DEFAULT_MAX_UNITS:g}."),
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


def comparison_options(func: Callable | None = None, *, with_format: bool = True, with_json: bool = True) -> Callable:
    """Add the comparison options to a click command; it receives ``comparison: ComparisonOptions``.

    With ``with_json`` the command also receives ``json_target`` (str or None). Use bare
    (``@comparison_options``) or with arguments (``@comparison_options(with_format=False)``
    when the command has its own ``--format``; set it with ``report_comparison(data_format=...)``).
    """

    def decorate(f: Callable) -> Callable:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = {key: kwargs.pop(key) for key in _OPTION_KEYS}
            data_format = kwargs.pop("data_format") if with_format else None
            kwargs["comparison"] = ComparisonOptions(
                settings=CompareSettings(
                    atol=_per_output(values["atol"]),
                    rtol=_per_output(values["rtol"]),
                    ulp=_per_output(values["ulp"]),
                    rel_l2=_per_output(values["rel_l2"]),
                    max_mismatch=_per_output(values["max_mismatch"]),
                    max_units=_per_output(values["max_units"]),
                    equal_nan=values["equal_nan"],
                    bias_check=values["bias_check"],
                ),
                key_map=dict(values["key_map"]),
                only=_names(values["only"]),
                ignore=_names(values["ignore"]),
                data_format=data_format,
                verbose=values["verbose"],
                brief=values["brief"],
                top=values["top"],
            )
            return f(*args, **kwargs)

        for option in reversed(_option_list(with_format, with_json)):
            wrapper = option(wrapper)
        return wrapper

    return decorate(func) if func is not None else decorate


def _check_override_names(options: ComparisonOptions, actual: Mapping[str, Any], reference: Mapping[str, Any]) -> None:
    known = set(actual) | set(reference)
    for option, names in options.settings.output_names().items():
        unknown = sorted(names - known)
        if unknown:
            flag = "--" + option.replace("_", "-")
            raise click.UsageError(f"{flag} names {', '.join(unknown)}, which is not an output (outputs: {', '.join(sorted(known))})")


def report_comparison(
    actual: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    options: ComparisonOptions,
    stdout_console,
    json_target: str | None,
    *,
    actual_label: str = "actual",
    reference_label: str = "reference",
    data_format: str | None = None,
    inputs: BackwardInputs | None = None,
    fsync: bool = False,
) -> ExitCode:
    """Compare two tensor sets, print the report (and JSON), return the exit code.

    ``json_target``: None, a path, or "-" (JSON replaces the rich report on stdout).
    ``data_format`` overrides ``options.data_format`` (for ``run``, whose --format it is).
    ``inputs``: the op's inputs, when known: the outputs are judged by the error model.
    Structural problems go to stderr as ``error: ...`` lines, once (the report on stdout only counts them).
    """
    from bnbwd_cli.judge.sets import compare_sets
    from bnbwd_cli.render import json as report_json
    from bnbwd_cli.render import text as report

    _check_override_names(options, actual, reference)
    if data_format is not None:
        options = replace(options, data_format=data_format)
    result = compare_sets(
        actual,
        reference,
        options.settings,
        key_map=options.key_map,
        only=options.only,
        ignore=options.ignore,
        data_format=options.data_format,
        top_k=options.top,
        inputs=inputs,
    )
    labels = {"actual_label": actual_label, "reference_label": reference_label}
    if json_target != "-":
        report.render_report(stdout_console, result, verbose=options.verbose, brief=options.brief, **labels)
    if json_target is not None:
        files_write.write_text(json_target, report_json.document_text(report_json.report_document(result, **labels)),
                               fsync=fsync)
    report.print_problems(result)
    return result.exit_code


# --------------------------------------------------------------------------- command

BACKWARD_INPUTS = ("src", "diff_dst", "mean", "variance", "gamma")  # the inputs BackwardInputs holds

_DEFAULTS_BLOCK = "\n".join(f"  {name:>4}  {tolerance_text(tol)}" for name, tol in DEFAULT_TOLERANCES.items())

_HELP = f"""Compare ACTUAL (your kernel's outputs) with REFERENCE key by key and print a report.

Each side is a .npy file (key = file stem), an .npz archive or a .safetensors
file (their keys), a directory of .npy files (keys = stems) or a headerless
dump raw:DTYPE:SHAPE:FILE (key = file stem; e.g. raw:f32:8x64x56x56:dx.bin).
PyTorch .pt/.pth pickles are refused (convert them: see bnbwd run --help).
Keys are matched by name, the specs' output names (x_backprop, input_delta...)
as ours; --map THEIRS=OURS renames a key in either file, --only/--ignore
select. When a file holds the op's outputs, those are compared; the inputs and
other keys a dump holds next to them are named in one note. A missing output is
a failure (exit 3), never a silent skip. Arrays stored as raw 2-byte void (|V2,
which is how np.save writes ml_dtypes.bfloat16) are read as bfloat16.

\b
With --inputs BUNDLE (the src, diff_dst, mean, variance, gamma the kernel
saw, as for `bnbwd run`), diff_src, diff_gamma and diff_beta are judged by
the problem's own error scale: each element gets the error a correct float32
kernel could make there (from the sums' sizes, M, and the rounding of its
terms; docs/tolerances.md), and passes when |a-r| <= K units + 1 ulp of the
output dtype (K = --max-units, default {DEFAULT_MAX_UNITS:g}). A systematic scale of
actual vs reference far beyond rounding noise (a wrong epsilon, an unbiased
variance) fails too, even when every element is within tolerance.
`bnbwd run INPUTS --reference KERNEL_OUT` judges the same way.

Without --inputs, fixed tolerances apply: an element passes if |a-r| <=
atol + rtol*|r| or it lies within --ulp ULPs of the output dtype, and each
output needs ||a-r||2/||r||2 <= rel_l2 and at most --max-mismatch failing
elements. diff_gamma and diff_beta are sums whose correct error grows with
the size of their terms, not of the result: give --inputs to judge them
fairly. Explicit --atol/--rtol/--ulp always use the fixed rule.
A NaN fails unless both sides are NaN and --equal-nan is given; infinities
must match in sign. When the sides' dtypes differ, the coarser one applies.

\b
Default fixed tolerances by dtype (rel_l2 = k * 2^-mantissa_bits):
{_DEFAULTS_BLOCK}

\b
Exit codes: 0 all outputs pass, 1 numerical mismatch, 2 usage error,
3 structural: missing key, shape mismatch (the report names the
transpose that would fix it, never applies it), unreadable file,
dtype that cannot be compared.
"""

_EPILOG = """\b
Examples:
  bnbwd verify kernel_out.npz ref.npz --inputs inputs.npz
  bnbwd verify kernel_out/ ref.npz --inputs inputs.npz --format NHWC --epsilon 1e-3
  bnbwd verify out.npz ref.npz --brief
  bnbwd verify tf.npz ref.npz --map x_backprop=diff_src \\
      --map scale_backprop=diff_gamma --map offset_backprop=diff_beta
  bnbwd verify out.npz ref.npz --atol 1e-4 --atol diff_gamma=1e-3 \\
      --max-mismatch 0.01%
  bnbwd verify out.npz ref.npz --json report.json
"""


fsync_option = click.option(
    "--fsync", is_flag=True,
    help="fsync each output file and its directory before the command ends (survives a power loss; slower). "
    "Without it outputs are still atomic: complete under their name, or absent.")


def _input_files(source: str) -> list[Path]:
    """The files a tensor-set argument reads (a directory: its .npy files), which no output may replace."""
    path = Path(source)
    return sorted(path.glob("*.npy")) if path.is_dir() else [path]


def read_judge_inputs(bundle: str, epsilon: float | None, data_format: str | None, *, training: bool,
                      variance_is_invstd: bool, key_map: Mapping[str, str], bf16: tuple[str, ...] = ()) -> BackwardInputs:
    """The op's inputs from a bundle (names, --map and attributes as for `bnbwd run`), checked like run checks them.
    Inputs named in `bf16` (canonical names) holding int16/uint16 bits are read as bfloat16."""
    from bnbwd_cli.judge.model import BackwardInputs

    label = f"--inputs ({bundle})"
    split = read_inputs(bundle, key_map, "--inputs")
    inputs, attributes = split.inputs, split.attributes
    reinterpret_bf16(bf16, {label: inputs})
    if split.note():
        click.echo(f"note: {label}: {split.note()}", err=True)
    profile = PROFILES["generic"]
    data_format = data_format or attributes.get("data_format") or profile.default_format
    epsilon = epsilon if epsilon is not None else attributes.get("epsilon")
    if epsilon is None:
        if not variance_is_invstd:
            raise click.UsageError(f"{label}: give --epsilon (the bundle has no 'epsilon' entry)")
        epsilon = 1.0  # unused: the variance input already is 1/sqrt(var + eps)
    epsilon = check_epsilon(epsilon, profile)
    canonical = validate_inputs(inputs, profile, data_format, variance_is_invstd=variance_is_invstd, outputs=OUTPUT_NAMES)
    return BackwardInputs(inputs["src"], inputs["diff_dst"], inputs["mean"], inputs["variance"], inputs.get("gamma"),
                          epsilon=epsilon, data_format=canonical, training=training, variance_is_invstd=variance_is_invstd)


@click.command("verify", help=_HELP, epilog=_EPILOG)
@click.argument("actual")
@click.argument("reference")
@click.option("--inputs", "inputs_bundle", metavar="BUNDLE.npz", help="The op's inputs (src, diff_dst, mean, variance, gamma; "
              "epsilon and data_format may be inside): judge by the problem's error scale.")
@click.option("--epsilon", type=float, help="With --inputs: epsilon, when the bundle has none.")
@click.option("--inference", is_flag=True, help="With --inputs: the kernel is TF's is_training=False backward.")
@click.option("--variance-is-invstd", is_flag=True, help="With --inputs: variance holds 1/sqrt(var+eps).")
@click.option("--bf16", "bf16_keys", multiple=True, metavar="KEY", help="Read KEY's 2-byte raw data (int16/uint16 "
              "bits, as PyTorch bf16 tensors are often dumped) as bfloat16, in ACTUAL, REFERENCE and --inputs. Repeatable.")
@fsync_option
@comparison_options
def verify(actual: str, reference: str, inputs_bundle: str | None, epsilon: float | None, inference: bool,
           variance_is_invstd: bool, bf16_keys: tuple[str, ...], fsync: bool, comparison: ComparisonOptions,
           json_target: str | None) -> None:
    if inputs_bundle is None and (epsilon is not None or inference or variance_is_invstd):
        raise click.UsageError("--epsilon, --inference and --variance-is-invstd describe --inputs; give --inputs BUNDLE")
    if json_target is not None and json_target != "-":
        sources = _input_files(actual) + _input_files(reference) + ([Path(inputs_bundle)] if inputs_bundle else [])
        files_write.vet_destination(json_target, sources, "--json")
    from bnbwd_cli.render.text import make_console

    actual_set = read_tensor_set(actual)
    reference_set = read_tensor_set(reference)
    found = reinterpret_bf16(bf16_keys, {actual: actual_set, reference: reference_set})
    inputs = None
    if inputs_bundle is not None:
        inputs = read_judge_inputs(inputs_bundle, epsilon, comparison.data_format, training=not inference,
                                   variance_is_invstd=variance_is_invstd, key_map=comparison.key_map, bf16=bf16_keys)
        found |= {key for key in bf16_keys if key in BACKWARD_INPUTS and getattr(inputs, key) is not None}
    check_found(bf16_keys, found, "ACTUAL, REFERENCE" + (" or --inputs" if inputs_bundle else ""))
    code = report_comparison(
        actual_set,
        reference_set,
        comparison,
        make_console(),
        json_target,
        actual_label=actual,
        reference_label=reference,
        inputs=inputs,
        fsync=fsync,
    )
    click.get_current_context().exit(code)
