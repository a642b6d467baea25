"""`bnbwd check CASE...`: many kernel dumps (inputs and outputs in one file) judged in one process.

Click only: parse, judge the cases through app/check.py (the judgement of `run --reference`), print a
line per case as it is judged and a summary (render/cases.py), exit 0, 1 or 3. The options that describe
the op are run's own definitions (cli/params.op_options), so they cannot drift apart.
"""

from __future__ import annotations

import click

from bnbwd_cli.app import check as app_check
from bnbwd_cli.app.inputs import OpSettings
from bnbwd_cli.cli.output import ReportWriter, echo_error, record_verdict
from bnbwd_cli.cli.params import (ComparisonOptions, ReportTargets, ShardValue, comparison_options, fsync_option,
                                  op_options, report_options)
from bnbwd_cli.cli.destinations import vet_outputs
from bnbwd_cli.cli.suite_reports import write_reports
from bnbwd_cli.files.read import source_files
from bnbwd_cli.literal import literal, literal_line
from bnbwd_cli.status import Status, exit_code

# The reports (render/, rich) are imported when a check runs.

_HELP = """Judge kernel outputs saved next to the inputs they came from, one case at a time.

A CASE is a file holding the op's inputs and the kernel's outputs (.npz, or a
directory of .npy files), or NAME.npz (the inputs) beside NAME.out.npz (the
outputs). A DIR argument means its *.npz cases, not recursive (NAME.out.npz
files are outputs, not cases); a directory of .npy files and no .npz is one
case. Inputs: src, diff_dst, mean, variance, optional gamma, beta, by
canonical name, any spec's (x, y_backprop, reserve_space_1, scale, ...) or
PyTorch's (input, grad_output, weight, bias, save_mean and save_invstd in
training, running_mean and running_var in inference); optional 0-d 'epsilon',
'data_format' and 'is_training'. Outputs: diff_src, diff_gamma, diff_beta or
a spec's or PyTorch's names (x_backprop, grad_input, grad_weight, ...). Your
own names: --map THEIRS=OURS (e.g. --map dy=diff_dst --map dx=diff_src), for
inputs and outputs alike. Other keys are named in a note (one named like
gamma is an error unless --ignore names it). A case's outputs are judged as
`bnbwd run --reference` judges them: each element by the error a correct
float32 kernel could make on that problem (K = --max-units). A case must
hold every output: one it lacks makes it fail with exit 3 (--only diff_src
judges fewer).

\b
--epsilon, --format, --spec, --inference, --variance-is-invstd and --bf16 KEY
mean what they mean for `bnbwd run` (--bf16 takes the file's key or ours); a
case's own 'epsilon', 'data_format' and 'is_training' entries win over
--epsilon, --format and --inference (these are the defaults for files that
say nothing).

\b
Prints one line per case (PASS/FAIL/ERROR, each output's largest error in
units, the first hint when one fails) and a summary; -q only the FAIL and
ERROR lines and the summary, -v each case's full report too. For CI: --json,
--junit (JUnit XML, one testcase per case) and --markdown (a table of the
failing cases for a pull request or $GITHUB_STEP_SUMMARY); '-' writes one of
them to stdout (the lines then go to stderr). Exit codes: 0 every case passes,
1 a case fails (the summary names it), 3 a case cannot be read or judged
(missing input, shapes that do not fit).
"""

_EPILOG = """\b
Examples:
  bnbwd check fixtures/pytorch_dump --format NCHW
  bnbwd check fixtures/cases/ --json check.json
  bnbwd check fixtures/cases/ --shard 1/2 --jobs 2
  bnbwd check fixtures/cases/ -q --junit check.xml --markdown -
  bnbwd check fixtures/example_case.npz --map dy=diff_dst --map var=variance \\
      --map dx=diff_src --map dgamma=diff_gamma --map dbeta=diff_beta
"""


@click.command("check", help=_HELP, epilog=_EPILOG)
@click.argument("cases", nargs=-1, required=True, metavar="CASE|DIR...")
@op_options
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Worker processes, one core thread each; the lines, summary and JSON are the same for any N (but "
              "each case's seconds).  [default: the usable cores]")
@click.option("--shard", type=ShardValue(), default=None,
              help="Judge only shard K of N: a contiguous block of the cases (in argument order, DIRs sorted); the N "
              "shards are disjoint and their lines, concatenated in order, are the unsharded run's (`bnbwd report` "
              "merges their --json documents).")
@report_options
@fsync_option
@comparison_options(with_format=False, with_save_error=False)
def check(cases: tuple[str, ...], fsync: bool, comparison: ComparisonOptions, json_target: str | None,
          **op_options) -> None:
    from bnbwd_cli.render import text as report_text

    jobs, shard = op_options.pop("jobs"), op_options.pop("shard")  # how to run, not what the op is
    targets = ReportTargets(json_target, op_options.pop("junit_target"), op_options.pop("markdown_target"),
                            op_options.pop("quiet"))
    found = app_check.find_cases(cases)
    if shard is not None:
        found = app_check.shard(found, *shard)
    vet_outputs(list(targets.named.items()), [path for case in found for source in (case.path, case.outputs_path)
                                              if source is not None for path in source_files(str(source))])
    op = OpSettings(epsilon=op_options["epsilon"], data_format=op_options["data_format"], spec=op_options["spec"],
                    training=False if op_options["inference"] else None,
                    variance_is_invstd=op_options["variance_is_invstd"])
    console = report_text.make_console(stderr=targets.stdout_taken)
    # The JSON document holds the details of failing outputs only: gathered on first use, as the lines' are.
    request = app_check.CaseRequest(op, comparison.judging, bf16_keys=op_options["bf16_keys"])
    writer = ReportWriter()  # a reader that stops reading (| head) ends the lines, never the judging

    def on_case(outcome: app_check.CaseOutcome) -> None:
        if not (targets.quiet and outcome.status == Status.PASS):
            writer.write(_print_case, console, outcome, comparison)

    outcomes = app_check.judge_cases(found, request, on_case=on_case, jobs=jobs,
                                      on_note=lambda note: echo_error(f"note: {note}"))
    code = exit_code(app_check.suite_verdict(outcomes))
    record_verdict(code)
    from bnbwd_cli.render import cases as report_cases

    writer.write(lambda: console.print(literal(report_cases.summary_line(outcomes), None), highlight=False, soft_wrap=True))
    if targets.wanted:
        write_reports(writer, targets, report_cases.check_document(outcomes, shard), fsync)
    writer.finish()
    click.get_current_context().exit(code)


def _print_case(console, outcome: app_check.CaseOutcome, comparison: ComparisonOptions) -> None:
    from bnbwd_cli.render import cases as report_cases
    from bnbwd_cli.render import text as report_text

    console.print(literal_line(report_cases.case_line(outcome)), highlight=False, soft_wrap=True)
    if comparison.verbose and outcome.result is not None:
        report_text.render_report(console, outcome.result, report_text.Labels(outcome.path, "bnbwd"),
                                  report_text.ReportStyle(verbose=False, brief=comparison.brief))
        console.print()
