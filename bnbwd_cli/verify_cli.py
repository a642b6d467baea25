"""`bnbwd verify` and the comparison options `run --reference` shares.

Click parses (custom ParamTypes fail with exit 2), compare.py computes, report.py prints.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import click
import numpy as np

from bnbwd_cli import report
from bnbwd_cli.compare import CompareSettings, MaxMismatch, PerOutput, compare_sets
from bnbwd_cli.errors import BnbwdError, ExitCode
from bnbwd_cli.params import FORMAT_CHOICE
from bnbwd_cli.tensor_io import read_tensor_set

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
    """``ACTUAL_KEY=REFERENCE_KEY``."""

    name = "ACTUAL_KEY=REFERENCE_KEY"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        actual, sep, reference = value.partition("=")
        if not sep or not actual or not reference:
            self.fail(f"{value!r}: expected ACTUAL_KEY=REFERENCE_KEY, e.g. x_backprop=diff_src", param, ctx)
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
    top: int = 10


_OPTION_KEYS = ("atol", "rtol", "ulp", "rel_l2", "max_mismatch", "equal_nan", "key_map", "only", "ignore", "verbose", "top")


def _option_list(with_format: bool, with_json: bool) -> list[Callable]:
    tolerance = ToleranceValue()
    options = [
        click.option("--atol", type=tolerance, multiple=True, help="Absolute tolerance (not scaled by magnitude); VALUE for all outputs or NAME=VALUE for one. Repeatable."),
        click.option("--rtol", type=tolerance, multiple=True, help="Relative tolerance, times |reference|; VALUE or NAME=VALUE. Repeatable."),
        click.option("--ulp", type=tolerance, multiple=True, help="An element also passes within this many ULPs of the output dtype at the reference; VALUE or NAME=VALUE. 0 turns it off."),
        click.option("--rel-l2", "rel_l2", type=tolerance, multiple=True, help="Bound on ||a-r||2/||r||2 per output; VALUE or NAME=VALUE."),
        click.option("--max-mismatch", type=MismatchValue(), multiple=True, help="Failing elements tolerated per output: N or P% (e.g. 0.01%); NAME=... for one output. Default 0."),
        click.option("--equal-nan", is_flag=True, help="NaN in both at the same position passes (otherwise any NaN fails)."),
        click.option("--map", "key_map", type=KeyPair(), multiple=True, help="Compare ACTUAL_KEY with REFERENCE_KEY (e.g. x_backprop=diff_src). Repeatable."),
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
                    equal_nan=values["equal_nan"],
                ),
                key_map=dict(values["key_map"]),
                only=_names(values["only"]),
                ignore=_names(values["ignore"]),
                data_format=data_format,
                verbose=values["verbose"],
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
) -> ExitCode:
    """Compare two tensor sets, print the report (and JSON), return the exit code.

    ``json_target``: None, a path, or "-" (JSON replaces the rich report on stdout).
    ``data_format`` overrides ``options.data_format`` (for ``run``, whose --format it is).
    Structural problems also go to stderr as ``error: ...`` lines.
    """
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
    )
    labels = {"actual_label": actual_label, "reference_label": reference_label}
    if json_target != "-":
        report.render_report(stdout_console, result, verbose=options.verbose, **labels)
    if json_target is not None:
        try:
            report.write_json(report.report_document(result, **labels), json_target)
        except OSError as exc:
            raise BnbwdError(f"--json {json_target}: cannot write ({exc.strerror or exc})") from None
    report.print_problems(result)
    return result.exit_code


# --------------------------------------------------------------------------- command

_DEFAULTS_BLOCK = "\n".join(f"  {name:>4}  {report.tolerance_text(tol)}" for name, tol in report.DEFAULT_TOLERANCES.items())

_HELP = f"""Compare ACTUAL with REFERENCE key by key and print a report.

Each side is a .npy file (key = file stem), an .npz archive (its keys) or a
directory of .npy files (keys = stems). Keys are matched by name; --map pairs
differently named keys, --only/--ignore select. A missing or extra key is a
failure (exit 3), never a silent skip. Arrays stored as raw 2-byte void (|V2,
which is how np.save writes ml_dtypes.bfloat16) are read as bfloat16.

Both sides are upcast to float64 (bfloat16 through float32). An element
passes if |a-r| <= atol + rtol*|r| (atol is absolute: diff_src cancels, so
near-zero elements carry absolute error) or it lies within --ulp units in the
last place of the output dtype at the reference. Each output also needs
||a-r||2/||r||2 <= rel_l2 (the benchdnn gate) and at most --max-mismatch
failing elements. A NaN fails unless both sides are NaN and --equal-nan is
given; infinities must match in sign. When the sides' dtypes differ, the
coarser dtype's defaults and ULP grid apply.

\b
Default tolerances by dtype (rel_l2 = k * 2^-mantissa_bits):
{_DEFAULTS_BLOCK}

\b
Exit codes: 0 all outputs pass, 1 numerical mismatch, 2 usage error,
3 structural: missing/extra key, shape mismatch (the report names the
transpose that would fix it, never applies it), unreadable file,
dtype that cannot be compared.
"""

_EPILOG = """\b
Examples:
  bnbwd verify out.npz ref.npz
  bnbwd verify kernel_out/ ref.npz --format NHWC -v
  bnbwd verify tf.npz ref.npz --map x_backprop=diff_src \\
      --map scale_backprop=diff_gamma --map offset_backprop=diff_beta
  bnbwd verify out.npz ref.npz --atol 1e-4 --atol diff_gamma=1e-3 \\
      --max-mismatch 0.01%
  bnbwd verify out.npz ref.npz --json report.json
"""


@click.command("verify", help=_HELP, epilog=_EPILOG)
@click.argument("actual")
@click.argument("reference")
@comparison_options
def verify(actual: str, reference: str, comparison: ComparisonOptions, json_target: str | None) -> None:
    actual_set = read_tensor_set(actual)
    reference_set = read_tensor_set(reference)
    code = report_comparison(
        actual_set,
        reference_set,
        comparison,
        report.make_console(),
        json_target,
        actual_label=actual,
        reference_label=reference,
    )
    click.get_current_context().exit(int(code))
