"""`bnbwd verify ACTUAL REFERENCE`: parse, read both sets and --inputs (app/judge.read_sets), judge them
(app/judge.judge_sets: with --inputs, judge_kernel, the judgement of run --reference, check and the API), record
the verdict, show the comparison (cli/show.py), exit with its code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import click

from bnbwd_cli.app.inputs import Naming, OpSettings
from bnbwd_cli.app.judge import FileSets, judge_sets, read_sets
from bnbwd_cli.cli.output import ReportWriter, echo_error, record_verdict
from bnbwd_cli.cli.destinations import vet_outputs
from bnbwd_cli.cli.params import ComparisonOptions, comparison_options, fsync_option, report_file_options, spec_option
from bnbwd_cli.judge.tolerance import DEFAULT_MAX_UNITS, DEFAULT_TOLERANCES, SUM_MAX_UNITS, tolerance_text

# The comparison (judge/) and the report (render/, rich) are imported where they are used (cli/show.py).

# --------------------------------------------------------------------------- command

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
ACTUAL must hold all three (exit 3 names one it lacks; --only judges fewer).
`bnbwd run INPUTS --reference KERNEL_OUT`, `bnbwd check` and the Python API
judge the same way.

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
    """The files a tensor-set argument reads (raw specs, directories and links too), which no output may replace."""
    from bnbwd_cli.files.read import source_files

    return source_files(source)


@dataclass(frozen=True)
class VerifyOptions:
    """verify's command line, parsed: one field per click parameter."""

    actual: str
    reference: str
    inputs_bundle: str | None
    epsilon: float | None
    inference: bool
    variance_is_invstd: bool
    spec: str
    bf16_keys: tuple[str, ...]
    fsync: bool
    junit_target: str | None
    markdown_target: str | None
    comparison: ComparisonOptions
    json_target: str | None


@click.command("verify", help=_HELP, epilog=_EPILOG)
@click.argument("actual")
@click.argument("reference")
@click.option("--inputs", "inputs_bundle", metavar="BUNDLE.npz", help="The op's inputs (src, diff_dst, mean, variance, gamma; "
              "epsilon and data_format may be inside): judge by the problem's error scale.")
@click.option("--epsilon", type=float, help="With --inputs: epsilon, when the bundle has none.")
@click.option("--inference", is_flag=True, help="With --inputs: the kernel is TF's is_training=False backward.")
@click.option("--variance-is-invstd", is_flag=True, help="With --inputs: variance holds 1/sqrt(var+eps).")
@spec_option
@click.option("--bf16", "bf16_keys", multiple=True, metavar="KEY", help="Read KEY's 2-byte raw data (int16/uint16 "
              "bits, as PyTorch bf16 tensors are often dumped) as bfloat16, in ACTUAL, REFERENCE and --inputs. Repeatable.")
@fsync_option
@report_file_options
@comparison_options
def verify(**kwargs) -> None:
    options = VerifyOptions(**kwargs)
    if options.inputs_bundle is None and (options.epsilon is not None or options.inference or options.variance_is_invstd
                                          or options.spec != "generic"):
        raise click.UsageError("--epsilon, --inference, --variance-is-invstd and --spec describe --inputs; give --inputs "
                               "BUNDLE")
    bundle = [Path(options.inputs_bundle)] if options.inputs_bundle else []
    read = _input_files(options.actual) + _input_files(options.reference) + bundle
    destinations = vet_outputs([("--json", options.json_target), ("--save-error", options.comparison.save_error),
                                ("--junit", options.junit_target), ("--markdown", options.markdown_target)], read)
    json_target, started = destinations.json_target, time.perf_counter()
    from bnbwd_cli.cli.show import Judged, ReportTarget, check_override_names, judging_for, show_comparison
    from bnbwd_cli.render.text import make_console

    op = OpSettings(options.epsilon, options.comparison.data_format, options.spec, False if options.inference else None,
                    options.variance_is_invstd)
    judging = options.comparison.judging
    files = FileSets(options.actual, options.reference, options.inputs_bundle, op,
                     Naming(judging.key_map, judging.ignore), options.bf16_keys)
    sets = read_sets(files, on_note=lambda note: echo_error(f"note: {note}"))
    check_override_names(options.comparison, [*sets.actual, *sets.reference])
    result = judge_sets(sets, judging_for(options.comparison, json_target), options.comparison.data_format)
    record_verdict(result.exit_code)  # decided before a word is printed: no report failure can change it
    writer = ReportWriter()
    judged = Judged(options.actual, sets.inputs, time.perf_counter() - started)
    show_comparison(result, (sets.actual_label, sets.reference_label), options.comparison,
                    ReportTarget(make_console(stderr=destinations.stdout_busy and json_target != "-"), json_target,
                                 options.fsync, destinations.reports, judged), writer)
    writer.finish()
    click.get_current_context().exit(result.exit_code)
