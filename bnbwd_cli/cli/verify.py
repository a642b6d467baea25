"""`bnbwd verify`, and report_comparison, the judgement `run --reference` shares.

Click parses (params.py: custom ParamTypes fail with exit 2), judge/ computes, render/ prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from bnbwd_cli.case import read_inputs
from bnbwd_cli.cli.params import ComparisonOptions, comparison_options, fsync_option
from bnbwd_cli.errors import ExitCode
from bnbwd_cli.files import write as files_write
from bnbwd_cli.files.read import read_tensor_set
from bnbwd_cli.files.reinterpret import check_found, reinterpret_bf16
from bnbwd_cli.judge.tolerance import DEFAULT_MAX_UNITS, DEFAULT_TOLERANCES, SUM_MAX_UNITS, tolerance_text
from bnbwd_cli.spec import OUTPUT_NAMES, PROFILES, resolve_epsilon, validate_inputs

if TYPE_CHECKING:
    from bnbwd_cli.core import Op

# The comparison (judge/) and the report (render/, rich) are imported where they are used: `bnbwd run`
# without --reference loads this module for its options only (tests/test_startup.py guards that).

def _check_override_names(options: ComparisonOptions, actual: Mapping[str, Any], reference: Mapping[str, Any]) -> None:
    known = set(actual) | set(reference)
    for option, names in options.judging.settings.output_names().items():
        unknown = sorted(names - known)
        if unknown:
            flag = "--" + option.replace("_", "-")
            raise click.UsageError(f"{flag} names {', '.join(unknown)}, which is not an output (outputs: {', '.join(sorted(known))})")


@dataclass(frozen=True)
class TensorSets:
    """What a comparison judges: the kernel's outputs (actual) and the reference, their names in the report,
    and the op's inputs when known (then the outputs are judged by the error model)."""

    actual: Mapping[str, np.ndarray]
    reference: Mapping[str, np.ndarray]
    actual_label: str = "actual"
    reference_label: str = "reference"
    inputs: Op | None = None


def report_comparison(sets: TensorSets, options: ComparisonOptions, stdout_console, json_target: str | None,  # noqa: ANN001
                      fsync: bool = False) -> ExitCode:
    """Compare two tensor sets, print the report (and JSON), return the exit code.

    ``json_target``: None, a path, or "-" (JSON replaces the rich report on stdout).
    Structural problems go to stderr as ``error: ...`` lines, once (the report on stdout only counts them).
    """
    from bnbwd_cli.judge.sets import compare_sets
    from bnbwd_cli.render import json as report_json
    from bnbwd_cli.render import text as report

    _check_override_names(options, sets.actual, sets.reference)
    judging = options.judging
    if json_target is not None or options.verbose:  # every output's details will be shown: gather them at once
        judging = replace(judging, details_up_front=True)
    result = compare_sets(sets.actual, sets.reference, judging, data_format=options.data_format, inputs=sets.inputs)
    if json_target != "-":
        report.render_report(stdout_console, result, report.Labels(sets.actual_label, sets.reference_label),
                             report.ReportStyle(verbose=options.verbose, brief=options.brief))
    if json_target is not None:
        document = report_json.report_document(result, actual_label=sets.actual_label, reference_label=sets.reference_label)
        files_write.write_text(json_target, report_json.document_text(document), fsync=fsync)
    report.print_problems(result)
    return result.exit_code


# --------------------------------------------------------------------------- command

BACKWARD_INPUTS = ("src", "diff_dst", "mean", "variance", "gamma")  # the arrays core.Op holds

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
output dtype (K = --max-units, default {DEFAULT_MAX_UNITS:g} for diff_src and
{SUM_MAX_UNITS:g} for diff_gamma and diff_beta). A systematic scale of
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


def _input_files(source: str) -> list[Path]:
    """The files a tensor-set argument reads (a directory: its .npy files), which no output may replace."""
    path = Path(source)
    return sorted(path.glob("*.npy")) if path.is_dir() else [path]


@dataclass(frozen=True)
class VerifyOptions:
    """verify's command line, parsed: one field per click parameter."""

    actual: str
    reference: str
    inputs_bundle: str | None
    epsilon: float | None
    inference: bool
    variance_is_invstd: bool
    bf16_keys: tuple[str, ...]
    fsync: bool
    comparison: ComparisonOptions
    json_target: str | None


def read_judge_inputs(options: VerifyOptions) -> Op:
    """The op's inputs from --inputs (names, --map and attributes as for `bnbwd run`), checked like run checks them.
    Inputs named in --bf16 (canonical names) holding int16/uint16 bits are read as bfloat16."""
    from bnbwd_cli.core import Op

    label = f"--inputs ({options.inputs_bundle})"
    split = read_inputs(options.inputs_bundle, options.comparison.judging.key_map, "--inputs")
    inputs, attributes = split.inputs, split.attributes
    reinterpret_bf16(options.bf16_keys, {label: inputs})
    if split.note():
        click.echo(f"note: {label}: {split.note()}", err=True)
    profile = PROFILES["generic"]
    data_format = options.comparison.data_format or attributes.get("data_format") or profile.default_format
    epsilon = resolve_epsilon(options.epsilon if options.epsilon is not None else attributes.get("epsilon"), profile,
                              options.variance_is_invstd)
    if epsilon is None:
        raise click.UsageError(f"{label}: give --epsilon (the bundle has no 'epsilon' entry)")
    canonical = validate_inputs(inputs, profile, data_format, variance_is_invstd=options.variance_is_invstd,
                                outputs=OUTPUT_NAMES)
    return Op(inputs["src"], inputs["diff_dst"], inputs["mean"], inputs["variance"], inputs.get("gamma"),
                          epsilon=epsilon, data_format=canonical, training=not options.inference,
                          variance_is_invstd=options.variance_is_invstd)


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
def verify(**kwargs) -> None:
    options = VerifyOptions(**kwargs)
    if options.inputs_bundle is None and (options.epsilon is not None or options.inference or options.variance_is_invstd):
        raise click.UsageError("--epsilon, --inference and --variance-is-invstd describe --inputs; give --inputs BUNDLE")
    json_target = options.json_target
    if json_target is not None and json_target != "-":
        bundle = [Path(options.inputs_bundle)] if options.inputs_bundle else []
        files_write.vet_destination(json_target, _input_files(options.actual) + _input_files(options.reference) + bundle,
                                    "--json")
    from bnbwd_cli.render.text import make_console

    actual_set = read_tensor_set(options.actual)
    reference_set = read_tensor_set(options.reference)
    bf16_keys = options.bf16_keys
    found = reinterpret_bf16(bf16_keys, {options.actual: actual_set, options.reference: reference_set})
    inputs = None
    if options.inputs_bundle is not None:
        inputs = read_judge_inputs(options)
        found |= {key for key in bf16_keys if key in BACKWARD_INPUTS and getattr(inputs, key) is not None}
    check_found(bf16_keys, found, "ACTUAL, REFERENCE" + (" or --inputs" if options.inputs_bundle else ""))
    sets = TensorSets(actual_set, reference_set, options.actual, options.reference, inputs)
    code = report_comparison(sets, options.comparison, make_console(), json_target, fsync=options.fsync)
    click.get_current_context().exit(code)
