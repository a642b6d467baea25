"""`bnbwd run`: parse, call app/run.py (and app/judge.judge_kernel with --reference: the verdict before any
printing), render, exit."""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bnbwd_cli import runtime
from bnbwd_cli.app import run as app_run
from bnbwd_cli.app.inputs import Naming, OpSettings
from bnbwd_cli.cli.destinations import Destinations, vet_outputs
from bnbwd_cli.cli.output import ReportWriter, echo_error, record_verdict
from bnbwd_cli.cli.params import (CONTEXT, MIN_BLOCK_BYTES, ArraySource, ByteSize, ComparisonOptions, OutputList,
                                  bf16_option, comparison_options, epsilon_option, format_option, fsync_option,
                                  inference_option, invstd_option, report_file_options, spec_option)
from bnbwd_cli.errors import InputError
from bnbwd_cli.files import write as files_write
from bnbwd_cli.files.read import source_files
from bnbwd_cli.spec import INPUT_NAMES, OUTPUT_NAMES

if TYPE_CHECKING:
    from bnbwd_cli.judge.sets import SetComparison

PROGRESS_MIN_BYTES = 256 << 20  # below this a run takes well under a second: no bar


RUN_EPILOG = """\b
Examples:
  bnbwd run fixtures/example.npz -o grads.npz
  bnbwd run --src x.npy --diff-dst dy.npy --mean m.npy --variance v.npy \\
            --gamma g.npy --epsilon 1e-5 --format NCHW --out-dir grads/
  bnbwd run bundle.npz --spec tensorflow --inference -o - | other-tool
  cat dy.npy | bnbwd run bundle.npz --diff-dst - -o grads.npz

\b
Inputs: a bundle .npz holds them by name (src, diff_dst, mean, variance, gamma,
beta) or by any spec's alias (input, input_forward, x, normalized_delta,
output_delta, y_backprop, reserve_space_1, reserve_space_2, scale, offset)
or PyTorch's (input, grad_output, weight, bias; save_mean and save_invstd in
training, running_mean and running_var in inference; save_invstd/invstd
imply --variance-is-invstd), plus optional 0-d 'epsilon', 'data_format' and
'is_training'. A flag overrides the bundle. A missing input's error suggests
a --map; an unused key named like gamma (weight, scale) is an error unless
--ignore KEY names it.
PATH is FILE.npy, FILE.npz:key, FILE.safetensors[:key], raw:DTYPE:SHAPE:FILE
for a headerless dump (e.g.
raw:f32:8x64x56x56:x.bin, raw:bf16:64:g.bin; the size must match), or -
(stdin, one array). The bundle may be an .npz or a .safetensors file.
PyTorch .pt/.pth files are pickles: refused, with how to convert them.
Raw 2-byte void arrays (|V2, how np.save stores ml_dtypes.bfloat16) are
read as bfloat16; --bf16 KEY reads uint16/int16 bits as bfloat16 too.

\b
Outputs: diff_src (dtype of src), diff_gamma and diff_beta (dtype of mean).
Reduced precision is computed in float32 with float64 sums, rounded once.
"""


@dataclass(frozen=True)
class RunOptions:
    """run's command line, parsed: one field per click parameter (--no-param-grads already folded into outputs)."""

    bundle: str | None
    src: str | None
    diff_dst: str | None
    mean: str | None
    variance: str | None
    gamma: str | None
    beta: str | None
    epsilon: float | None
    data_format: str | None
    spec: str
    inference: bool
    variance_is_invstd: bool
    outputs: tuple[str, ...]
    output: str | None
    out_dir: Path | None
    bf16_keys: tuple[str, ...]
    threads: int | None
    block_size: int | None
    core: str
    json_target: str | None
    quiet: bool
    stream: bool | None
    fsync: bool
    reference: str | None
    junit_target: str | None
    markdown_target: str | None
    comparison: ComparisonOptions

    @property
    def sources(self) -> dict[str, str]:
        """The inputs given by flag (--src ...), by canonical name."""
        values = (self.src, self.diff_dst, self.mean, self.variance, self.gamma, self.beta)
        return {name: value for name, value in zip(INPUT_NAMES, values) if value}

    @property
    def bf16_outputs(self) -> list[str]:
        """--bf16 keys that are not inputs: keys of the kernel's outputs (--reference)."""
        return [key for key in self.bf16_keys if key not in INPUT_NAMES]

    @property
    def has_file_output(self) -> bool:
        return self.out_dir is not None or (self.output is not None and self.output != "-")

    def request(self) -> app_run.RunRequest:
        op = OpSettings(self.epsilon, self.data_format, self.spec, False if self.inference else None,
                        self.variance_is_invstd)
        return app_run.RunRequest(
            bundle=self.bundle, sources=self.sources, op=op, outputs=self.outputs,
            destination=app_run.Destination(self.output, self.out_dir, self.fsync),
            compute=app_run.Compute(self.threads, self.block_size, self.core, self.stream),
            naming=Naming(self.comparison.judging.key_map, self.comparison.judging.ignore), bf16_keys=self.bf16_keys, keep_outputs=self.reference is not None,
            kernel=self.reference)


@click.command("run", epilog=RUN_EPILOG, context_settings=CONTEXT)
@click.argument("bundle", required=False, metavar="[BUNDLE.npz|BUNDLE.safetensors|-]")
@click.option("--src", type=ArraySource(), help="Forward input (input, input_forward, x).")
@click.option("--diff-dst", type=ArraySource(), help="Gradient w.r.t. the output (output_delta, y_backprop).")
@click.option("--mean", type=ArraySource(), help="Per-channel batch mean, shape (C,).")
@click.option("--variance", type=ArraySource(), help="Per-channel batch variance, shape (C,).")
@click.option("--gamma", type=ArraySource(), help="Per-channel scale (optional: 1 if absent).")
@click.option("--beta", type=ArraySource(), help="Per-channel shift: checked, not used by the math.")
@epsilon_option
@format_option
@spec_option
@inference_option
@invstd_option
@click.option("--outputs", type=OutputList(), default=",".join(OUTPUT_NAMES), show_default=True,
              help="Which outputs to produce.")
@click.option("--no-param-grads", is_flag=True, help="Produce diff_src only (same as --outputs diff_src).")
@click.option("-o", "--output", metavar="OUT.npz|-", help="Write the outputs to one .npz (- = stdout).")
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), help="Write DIR/diff_src.npy etc. (DIR is created when missing).")
@bf16_option
@click.option("--threads", type=click.IntRange(min=1), help="Worker threads.  [default: usable cores]")
@click.option("--block-size", type=ByteSize(minimum=MIN_BLOCK_BYTES),
              help=f"Cache budget of one tile, e.g. 8M; smaller values are raised to {MIN_BLOCK_BYTES >> 10}K.  "
              "[default: from the CPU caches]")
@click.option("--core", type=click.Choice(["auto", "numpy", "numba"]), default="auto", show_default=True,
              help="Compute core: numba (optional compiled core, pip install 'bnbwd[fast]'; a faster kernel, "
              "a longer start-up), numpy, or auto (numba when installed and src is in memory "
              "and has >= 100M elements, unless $BNBWD_CORE=numpy).")
@click.option("--json", "json_target", metavar="PATH|-", help="Also write the run's facts as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No summary, warnings or progress bar.")
@click.option("--stream/--no-stream", default=None, help="Out-of-core: read src and diff_dst (.npy files) by blocks "
              "of channels and write diff_src by blocks (needs -o FILE.npz or --out-dir); --no-stream loads them.  "
              "[default: on when src and diff_dst are .npy files over 1/4 of available memory, or over 256 MiB where "
              "a block of channels is read in long runs (not channels last or small planes), and the output is a file]")
@fsync_option
@click.option("--reference", metavar="KERNEL_OUT", help="Judge KERNEL_OUT (your kernel's outputs: .npz, .npy or a "
              "directory) against bnbwd's, by the problem's own error scale, as `bnbwd verify --inputs` does; exit 1 "
              "on mismatch, 3 when it lacks one of --outputs (--only judges fewer). The options below tune it (--map THEIRS=OURS also renames the bundle's inputs).")
@report_file_options
@comparison_options(with_format=False, with_json=False)
def run(no_param_grads: bool, **kwargs) -> None:
    """Compute diff_src, diff_gamma and diff_beta from the forward input, the output gradient and the batch stats."""
    if no_param_grads:
        kwargs["outputs"] = ("diff_src",)
    options = RunOptions(**kwargs)
    _check_usage(options)
    vetted = _vet_paths(options)
    options, destinations = replace(options, json_target=vetted.json_target), vetted.files
    started = time.perf_counter()
    request = options.request()
    click.get_current_context().with_resource(files_write.one_commit())  # outputs and --json: one set (LIFO: before --out-dir's cleanup)
    with contextlib.ExitStack() as stack:
        prepared = app_run.prepare(request, stack)
        if prepared.note and not options.quiet:
            echo_error(f"note: {prepared.note}")
        stderr_console = None if options.quiet else _console(stderr=True)
        computed = _compute(request, prepared, stack, stderr_console)
        written = [files_write.display(p) for p in destinations] or (["-"] if options.output == "-" else [])  # \xff: not UTF-8
        facts = app_run.facts(request, prepared, computed, written)
        # The verdict first, recorded before a word is printed: a stdout that fails (/dev/full, a reader gone)
        # cuts the report short, never the judging nor its exit code.
        result = None
        if options.reference is not None:
            result = _judge_reference(options, request, prepared, computed, stderr_console, stack)
            record_verdict(result.exit_code)
        report_console = _console(stderr=vetted.stdout_busy) if not options.quiet or result is not None else None
        if options.json_target and result is None:
            from bnbwd_cli.render import json as report_json  # only --json writes JSON

            files_write.write_text(options.json_target, report_json.document_text(report_json.run_document(facts)),
                                   fsync=options.fsync)
        writer = ReportWriter()
        if not options.quiet:
            from bnbwd_cli.render.run import render_run

            writer.write(render_run, report_console, stderr_console, facts)
        if result is not None:
            from bnbwd_cli.cli.show import Judged, ReportTarget, show_comparison

            show_comparison(result, (options.reference, "bnbwd run"), options.comparison,
                            ReportTarget(report_console, options.json_target, options.fsync, vetted.reports,
                                         Judged(options.reference, prepared.op, time.perf_counter() - started)),
                            writer)
        writer.finish()
        if result is not None:
            click.get_current_context().exit(result.exit_code)


def _check_usage(options: RunOptions) -> None:
    """Usage errors (exit 2) that the flags alone show, before any file is read."""
    stdin_users = [name for name, value in [("BUNDLE", options.bundle), *options.sources.items()] if value == "-"]
    if len(stdin_users) > 1:
        raise click.UsageError(f"only one input can come from stdin ('-'), got {', '.join(stdin_users)}")
    if options.output is not None and options.out_dir is not None:
        raise click.UsageError("give -o/--output or --out-dir, not both")
    if options.output is not None and options.output.lower().endswith(".npy"):
        raise click.UsageError(f"-o {options.output}: -o writes one .npz archive of diff_src, diff_gamma and diff_beta, "
                               f"not a .npy; give -o {options.output[:-4]}.npz, or --out-dir DIR for one .npy per output")
    if options.output == "-" and sys.stdout is None:  # started with `>&-`: before any work, not after it
        raise InputError("-o -: stdout is closed; give -o FILE")
    if options.output == "-" and sys.stdout.isatty():
        raise click.UsageError("refusing to write binary .npz data to a terminal; redirect stdout or use -o FILE")
    if options.stream and not options.has_file_output:
        raise click.UsageError("--stream writes diff_src through a file: give -o OUT.npz or --out-dir DIR")
    if options.core == "numba" and not runtime.numba_available():
        raise click.UsageError("--core numba needs numba, which is not installed: pip install 'bnbwd[fast]'")
    if options.bf16_outputs and options.reference is None:
        raise click.UsageError(f"--bf16 {options.bf16_outputs[0]}: not an input ({', '.join(INPUT_NAMES)}); "
                               "a kernel output's key needs --reference KERNEL_OUT")


def _vet_paths(options: RunOptions) -> Destinations:
    """The output files, checked against every file the run reads (no output overwrites an input)."""
    if options.out_dir is not None:  # made when missing (mkdir -p), removed again if the run fails
        from bnbwd_cli.files.destinations import output_directory

        click.get_current_context().with_resource(output_directory(options.out_dir))
    input_paths = _input_paths(options) + _reference_paths(options)
    outputs = [("-o", options.output)] if options.output is not None else [("--out-dir", p) for p in _output_paths(options)]
    judged = {"--save-error": options.comparison.save_error, "--junit": options.junit_target,
              "--markdown": options.markdown_target}  # a judgement's files: they need --reference
    for flag, target in judged.items():
        if target is not None and options.reference is None:
            raise click.UsageError(f"{flag} {'saves' if flag == '--save-error' else 'reports'} a judgement: give "
                                   "--reference KERNEL_OUT")
    destinations = vet_outputs([*outputs, ("--json", options.json_target), *judged.items()], input_paths)
    if options.reference is not None and not Path(options.reference).exists():
        raise InputError(f"reference {options.reference}: no such file or directory")
    return destinations


def _output_paths(options: RunOptions) -> list[str | Path]:
    if options.output is not None and options.output != "-":
        return [options.output]
    if options.out_dir is not None:
        return [options.out_dir / f"{name}.npy" for name in options.outputs]
    return []


def _input_paths(options: RunOptions) -> list[Path]:
    sources = [options.bundle] if options.bundle else []
    return [path for source in [*sources, *options.sources.values()] for path in source_files(source)]


def _reference_paths(options: RunOptions) -> list[Path]:
    """The files --reference would read, so that no output overwrites them (a run compared with itself)."""
    if not options.reference:
        return []
    return source_files(options.reference)


def _compute(request: app_run.RunRequest, prepared: app_run.Prepared, stack: contextlib.ExitStack,
             stderr_console) -> app_run.Computed:
    """The run, with a progress bar on a terminal when it takes long enough to want one."""
    progress_bar, on_progress = _progress_bar(prepared, stack, stderr_console, "backward")
    computed = app_run.compute(request, prepared, on_progress)
    if progress_bar is not None:
        progress_bar.stop()
    return computed


def _progress_bar(prepared: app_run.Prepared, stack: contextlib.ExitStack, stderr_console, description: str):
    """(bar, callback) started on a terminal for inputs large enough to want one, else (None, None)."""
    if stderr_console is None or not stderr_console.is_terminal or prepared.op.src.nbytes < PROGRESS_MIN_BYTES:
        return None, None
    from bnbwd_cli.render.run import progress_bar as make_bar  # rich: only when a bar shows

    progress_bar, on_progress = make_bar(stderr_console, description)
    stack.callback(progress_bar.stop)
    progress_bar.start()
    return progress_bar, on_progress


def _judge_reference(options: RunOptions, request: app_run.RunRequest, prepared: app_run.Prepared,
                     computed: app_run.Computed, stderr_console, stack: contextlib.ExitStack) -> SetComparison:
    """--reference: the file is the kernel under test, judged against the outputs this run computed (app/judge's
    judge_kernel, as check and the API judge); the run's --outputs are the ones the kernel must give. stderr_console:
    the progress bar's (None under --quiet)."""
    from bnbwd_cli.app.judge import judge_kernel  # the comparison: only when judging
    from bnbwd_cli.cli.show import check_override_names, judging_for

    op, kernel = app_run.kernel_under_test(request, prepared, options.reference)
    check_override_names(options.comparison, [*kernel, *computed.arrays])
    # --threads is the judging's too
    judging = replace(judging_for(options.comparison, options.json_target), threads=options.threads)
    progress_bar, on_progress = _progress_bar(prepared, stack, stderr_console, "judging")
    return judge_kernel(op, kernel, judging, required=request.outputs, reference=computed.arrays,
                        progress=on_progress and _stopping_at_the_end(progress_bar, on_progress))


def _stopping_at_the_end(progress_bar, on_progress):
    """on_progress, and the bar stopped once judging is done (before the report prints)."""
    def update(done: int, total: int) -> None:
        on_progress(done, total)
        if done >= total:
            progress_bar.stop()

    return update


def _console(stderr: bool):
    """A rich console, imported here: `run -q` renders nothing and never loads rich (tests/test_startup.py)."""
    from bnbwd_cli.render.text import make_console

    return make_console(stderr=stderr)
