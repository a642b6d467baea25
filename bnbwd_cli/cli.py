"""The click layer: parse, gather inputs, call the core once, write, render."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from traceback import format_exc

import click
import numpy as np

from bnbwd_cli import __version__, streaming
from bnbwd_cli import core as compute_core
from bnbwd_cli.errors import BnbwdError, ExitCode
from bnbwd_cli.case import read_inputs
from bnbwd_cli.check_cli import check, with_run_options
from bnbwd_cli.files import blocks as files_blocks
from bnbwd_cli.files import read as files_read
from bnbwd_cli.files import write as files_write
from bnbwd_cli.files.read import read_array, read_tensor_set, split_source
from bnbwd_cli.files.reinterpret import check_found, reinterpret_bf16
from bnbwd_cli.params import FORMAT_CHOICE, MIN_BLOCK_BYTES, ArraySource, ByteSize, OutputList
from bnbwd_cli.profiles import (
    INPUT_NAMES,
    OUTPUT_NAMES,
    PROFILES,
    check_epsilon,
    validate_inputs,
)
from bnbwd_cli.run_summary import RunFacts, render_run, run_json
from bnbwd_cli.verify_cli import comparison_options, fsync_option, report_comparison, verify

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
PROGRESS_MIN_BYTES = 256 << 20  # below this a run takes well under a second: no bar


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that the same cleanup as for Ctrl-C runs."""


def _on_sigterm(signum, frame) -> None:  # noqa: ANN001 - signal's signature
    raise Terminated()


@contextlib.contextmanager
def _sigterm_as_exception():
    """SIGTERM -> Terminated for the duration (main thread only; elsewhere the default stays)."""
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _echo_error(text: str) -> None:
    """One line on stderr; a failing stderr cannot change the exit code."""
    with contextlib.suppress(OSError, ValueError):
        click.echo(text, err=True)


def _show_error(exc: click.ClickException) -> None:
    """Every error is one `error: ...` line on stderr; a usage error also names the --help to read.

    click's own block (Usage:, Try ..., Error: ...) spans three lines; `bnbwd` alone still prints the help.
    """
    if not isinstance(exc, click.UsageError) or isinstance(exc, click.exceptions.NoArgsIsHelpError):
        exc.show()
        return
    text = " ".join(exc.format_message().split())
    if exc.ctx is not None:
        text += f" (see '{exc.ctx.command_path} --help')"
    click.echo(f"error: {text}", err=True)


class BnbwdGroup(click.Group):
    """Maps failures that are not user errors to one line and a stable exit code."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # noqa: ANN001
        """click's main, with exit codes that a failing stdout or stderr cannot change, and SIGTERM handled."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        with _sigterm_as_exception():
            try:
                code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
                code = code if isinstance(code, int) else ExitCode.OK
                _flush_stdout()
            except click.exceptions.Exit as exc:
                code = exc.exit_code
            except click.ClickException as exc:
                with contextlib.suppress(OSError, ValueError):
                    _show_error(exc)
                code = exc.exit_code
            except (click.exceptions.Abort, KeyboardInterrupt) as exc:  # Ctrl-C while parsing the command line
                code = _interrupted(exc.__context__ if isinstance(exc, click.exceptions.Abort) else exc)
            except OSError as exc:  # stdout failed at the final flush
                code = _stream_failed(exc)
        sys.exit(code)

    def invoke(self, ctx: click.Context):
        try:
            with warnings.catch_warnings():
                # NumPy's "invalid value encountered" lines are noise: a run counts and reports NaN/Inf itself.
                warnings.simplefilter("ignore", RuntimeWarning)
                return super().invoke(ctx)
        except MemoryError:
            raise BnbwdError("out of memory; try --stream (inputs as .npy files) or a smaller --block-size") from None
        except KeyboardInterrupt as exc:
            ctx.exit(_interrupted(exc))
        except OSError as exc:  # writing the report to stdout or stderr failed (closed, full device)
            ctx.exit(_stream_failed(exc))
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:  # a bug in bnbwd: one line, and the traceback on request
            if ctx.params.get("traceback") or os.environ.get("BNBWD_TRACEBACK"):
                _echo_error(format_exc().rstrip())  # and still exit 4: an uncaught exception would exit 1 (mismatch)
            else:
                _echo_error(f"error: internal error: {type(exc).__name__}: {exc} (rerun with --traceback)")
            ctx.exit(ExitCode.INTERNAL)


def _interrupted(exc: BaseException | None) -> ExitCode:
    if isinstance(exc, Terminated):
        _echo_error("error: terminated (SIGTERM); no partial output file is left")
        return ExitCode.TERMINATED
    _echo_error("error: interrupted; no partial output file is left")
    return ExitCode.INTERRUPTED


def _stream_failed(exc: OSError) -> ExitCode:
    """stdout or stderr failed: exit 3 (an output that cannot be written), never 1 or 4."""
    _silence_stdout()
    if isinstance(exc, BrokenPipeError):  # the reader of stdout went away (`bnbwd run ... -o - | head -c 10`)
        _echo_error("error: stdout was closed before bnbwd finished writing to it (broken pipe)")
    else:
        _echo_error(f"error: cannot write to stdout or stderr ({files_read.reason(exc)})")
    return ExitCode.INPUT


def _flush_stdout() -> None:
    stream = sys.stdout
    if stream is not None:
        stream.flush()


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (e.g. under CliRunner)
        pass


@click.group(cls=BnbwdGroup, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="bnbwd")
@click.option("--traceback", is_flag=True, help="Show a Python traceback on internal errors.")
def main(traceback: bool) -> None:
    """Batch-normalization training backward pass, from tensors on disk.

    \b
    Exit codes: 0 ok, 1 verification mismatch, 2 usage error,
                3 input error (unreadable, malformed or inconsistent input,
                  or an output that cannot be written),
                4 internal error (a bug: rerun with --traceback),
                130 interrupted (Ctrl-C), 143 terminated (SIGTERM).

    \b
    Start with:  bnbwd run --help,  bnbwd verify --help  and  bnbwd check --help
    """


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
output_delta, y_backprop, reserve_space_1, reserve_space_2, scale, offset),
plus optional 0-d 'epsilon' and 'data_format'. A flag overrides the bundle.
PATH is FILE.npy, FILE.npz:key, FILE.safetensors[:key] (pip install
'bnbwd[safetensors]'), raw:DTYPE:SHAPE:FILE for a headerless dump (e.g.
raw:f32:8x64x56x56:x.bin, raw:bf16:64:g.bin; the size must match), or -
(stdin, one array). The bundle may be an .npz or a .safetensors file.
PyTorch .pt/.pth files are pickles: refused, with how to convert them.
Raw 2-byte void arrays (|V2, how np.save stores ml_dtypes.bfloat16) are
read as bfloat16; --bf16 KEY reads uint16/int16 bits as bfloat16 too.

\b
Outputs: diff_src (dtype of src), diff_gamma and diff_beta (dtype of mean).
Reduced precision is computed in float32 with float64 sums, rounded once.
"""


def _output_paths(output: str | None, out_dir: Path | None, outputs: tuple[str, ...]) -> list[str | Path]:
    if output is not None and output != "-":
        return [output]
    if out_dir is not None:
        return [out_dir / f"{name}.npy" for name in outputs]
    return []


def _input_paths(bundle: str | None, sources: dict[str, str]) -> list[Path]:
    paths = [bundle] if bundle else []
    paths += [split_source(source)[0] for source in sources.values()]
    return [Path(p) for p in paths if p != "-"]


def _reference_paths(reference: str | None, outputs: tuple[str, ...]) -> list[Path]:
    """The files --reference would read, so that no output overwrites them (a run compared with itself)."""
    if not reference:
        return []
    path = Path(reference)
    return [path / f"{name}.npy" for name in outputs] if path.is_dir() else [path]


def _console(stderr: bool):
    """A rich console, imported here: `run -q` renders nothing and never loads rich (tests/test_startup.py)."""
    from bnbwd_cli.render.text import make_console

    return make_console(stderr=stderr)


def _progress_callback(console, enabled: bool):
    """A rich progress bar on stderr, or None."""
    if not enabled:
        return None, None
    from rich.progress import BarColumn, Progress, TimeRemainingColumn

    bar = Progress("[progress.description]{task.description}", BarColumn(), "{task.percentage:>3.0f}%",
                   TimeRemainingColumn(), console=console, transient=True)
    task = bar.add_task("backward", total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return bar, update


@main.command("run", epilog=RUN_EPILOG, context_settings=CONTEXT)
@click.argument("bundle", required=False, metavar="[BUNDLE.npz|BUNDLE.safetensors|-]")
@click.option("--src", type=ArraySource(), help="Forward input (input, input_forward, x).")
@click.option("--diff-dst", type=ArraySource(), help="Gradient w.r.t. the output (output_delta, y_backprop).")
@click.option("--mean", type=ArraySource(), help="Per-channel batch mean, shape (C,).")
@click.option("--variance", type=ArraySource(), help="Per-channel batch variance, shape (C,).")
@click.option("--gamma", type=ArraySource(), help="Per-channel scale (optional: 1 if absent).")
@click.option("--beta", type=ArraySource(), help="Per-channel shift: checked, not used by the math.")
@click.option("--epsilon", type=float, help="Added to the variance (tensorflow default 1e-4; others: required).")
@click.option("--format", "data_format", type=FORMAT_CHOICE,
              help="Layout: NCX or NXC, or an alias (NC, NCW, NWC, NCHW, NHWC, NCDHW, NDHWC).  [default: the spec's]")
@click.option("--spec", type=click.Choice(list(PROFILES)), default="generic", show_default=True,
              help="Whose defaults and dtype rules apply.")
@click.option("--inference", is_flag=True, help="TF is_training=False: diff_src = gamma*invstd*diff_dst.")
@click.option("--variance-is-invstd", is_flag=True, help="variance holds 1/sqrt(var+eps) (cuDNN reserve space); epsilon unused.")
@click.option("--outputs", type=OutputList(), default=",".join(OUTPUT_NAMES), show_default=True,
              help="Which outputs to produce.")
@click.option("--no-param-grads", is_flag=True, help="Produce diff_src only (same as --outputs diff_src).")
@click.option("-o", "--output", metavar="OUT.npz|-", help="Write the outputs to one .npz (- = stdout).")
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), help="Write DIR/diff_src.npy etc. (DIR is created when missing).")
@click.option("--bf16", "bf16_inputs", multiple=True, metavar="KEY",
              help="Read KEY's 2-byte raw data (int16/uint16 bits) as bfloat16: an input (src, diff_dst, ...) or, "
              "with --reference, a key of KERNEL_OUT. Repeatable.")
@click.option("--threads", type=click.IntRange(min=1), help="Worker threads.  [default: usable cores]")
@click.option("--block-size", type=ByteSize(minimum=MIN_BLOCK_BYTES),
              help=f"Cache budget of one tile, e.g. 8M; smaller values are raised to {MIN_BLOCK_BYTES >> 10}K.  "
              "[default: from the CPU caches]")
@click.option("--core", type=click.Choice(["auto", "numpy", "numba"]), default="auto", show_default=True,
              help="Compute core: numba (optional compiled core, pip install 'bnbwd[fast]'; 4-20x faster kernel, "
              "~0.5 s start-up), numpy, or auto (numba when installed and src is in memory "
              "and >= 256 MiB, unless $BNBWD_CORE=numpy).")
@click.option("--json", "json_target", metavar="PATH|-", help="Also write the run's facts as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No summary, warnings or progress bar.")
@click.option("--stream/--no-stream", default=None, help="Out-of-core: read src and diff_dst (.npy files) by blocks "
              "of channels and write diff_src by blocks (needs -o FILE.npz or --out-dir); --no-stream loads them.  "
              "[default: on when src and diff_dst are .npy files over 256 MiB (or 1/4 of available memory) and the "
              "output is a file]")
@fsync_option
@click.option("--reference", metavar="KERNEL_OUT", help="Judge KERNEL_OUT (your kernel's outputs: .npz, .npy or a "
              "directory) against bnbwd's, by the problem's own error scale, as `bnbwd verify --inputs` does; exit 1 "
              "on mismatch. The options below tune it (--map THEIRS=OURS also renames the bundle's inputs).")
@comparison_options(with_format=False, with_json=False)
def run(bundle, src, diff_dst, mean, variance, gamma, beta, epsilon, data_format, spec, inference,
        variance_is_invstd, outputs, no_param_grads, output, out_dir, bf16_inputs, threads, block_size, core,
        json_target, quiet, stream, fsync, reference, comparison) -> None:
    """Compute diff_src, diff_gamma and diff_beta from the forward input, the output gradient and the batch stats."""
    sources = {name: value for name, value in zip(INPUT_NAMES, (src, diff_dst, mean, variance, gamma, beta)) if value}
    stdin_users = [name for name, value in [("BUNDLE", bundle), *sources.items()] if value == "-"]
    if len(stdin_users) > 1:
        raise click.UsageError(f"only one input can come from stdin ('-'), got {', '.join(stdin_users)}")
    if output is not None and out_dir is not None:
        raise click.UsageError("give -o/--output or --out-dir, not both")
    if output == "-" and json_target == "-":
        raise click.UsageError("-o - and --json - both want stdout; send one to a file")
    if output == "-" and sys.stdout.isatty():
        raise click.UsageError("refusing to write binary .npz data to a terminal; redirect stdout or use -o FILE")
    if core == "numba" and not compute_core.numba_available():
        raise click.UsageError("--core numba needs numba, which is not installed: pip install 'bnbwd[fast]'")
    if no_param_grads:
        outputs = ("diff_src",)
    bf16_outputs = [key for key in bf16_inputs if key not in INPUT_NAMES]  # keys of the kernel's outputs
    if bf16_outputs and reference is None:
        raise click.UsageError(f"--bf16 {bf16_outputs[0]}: not an input ({', '.join(INPUT_NAMES)}); "
                               "a kernel output's key needs --reference KERNEL_OUT")
    if out_dir is not None:  # made when missing (mkdir -p), removed again if the run fails
        click.get_current_context().with_resource(files_write.output_directory(out_dir))
    input_paths = _input_paths(bundle, sources) + _reference_paths(reference, outputs)
    destinations = files_write.vet_destinations(_output_paths(output, out_dir, outputs), input_paths)
    if json_target is not None and json_target != "-":
        json_path = files_write.vet_destination(json_target, input_paths, "--json")
        if any(json_path.resolve() == path.resolve() for path in destinations):
            raise click.UsageError(f"--json {json_target} is also the output file; give it another name")
    if reference is not None and not Path(reference).exists():
        raise BnbwdError(f"reference {reference}: no such file or directory")

    profile = PROFILES[spec]
    split = read_inputs(bundle, comparison.key_map) if bundle else None  # --map THEIRS=OURS renames inputs too
    inputs, attributes = (split.inputs, split.attributes) if split else ({}, {})
    if split and split.note() and not quiet:
        _echo_error(f"note: bundle ({bundle}): {split.note()}")
    has_file_output = out_dir is not None or (output is not None and output != "-")
    # Large .npy inputs stream by themselves. With --core numba only those too large to load safely do, and then
    # the refusal below says why.
    if stream is None:
        stream = has_file_output and streaming.should_stream(sources, memory_only=core == "numba")
    if stream and not has_file_output:
        raise click.UsageError("--stream writes diff_src through a file: give -o OUT.npz or --out-dir DIR")
    with contextlib.ExitStack() as stack:
        for name, source in sources.items():
            blocks = files_blocks.open_npy_blocks(source, name) if stream and name in ("src", "diff_dst") else None
            if blocks is not None:
                stack.callback(blocks.close)
            inputs[name] = blocks if blocks is not None else read_array(source, name)
        bf16_names = [key for key in bf16_inputs if key in INPUT_NAMES]
        check_found(bf16_names, reinterpret_bf16(bf16_names, {"the inputs": inputs}), "the inputs")
        data_format = data_format or attributes.get("data_format") or profile.default_format
        epsilon = _resolve_epsilon(epsilon, attributes, profile, variance_is_invstd)
        canonical = validate_inputs(inputs, profile, data_format, variance_is_invstd=variance_is_invstd, outputs=outputs)
        if profile.paired_param_grads and "diff_gamma" not in outputs:
            inputs.pop("gamma", None)  # oneDNN Graph: without diff_gamma/diff_beta, gamma is ignored

        stderr_console = None if quiet else _console(stderr=True)
        progress_bar, on_progress = _progress_callback(
            stderr_console, not quiet and stderr_console.is_terminal and inputs["src"].nbytes >= PROGRESS_MIN_BYTES)
        started = time.perf_counter()
        if progress_bar:
            stack.callback(progress_bar.stop)
            progress_bar.start()
        stats = {}
        if stream:
            run_options = streaming.StreamedRun(epsilon, canonical, not inference, variance_is_invstd, outputs,
                                                block_size, threads, core)
            arrays, stats, ran = _run_streamed(inputs, run_options, output, out_dir, fsync, on_progress,
                                               keep_diff_src=reference is not None)
        else:
            op = compute_core.Op(inputs["src"], inputs["diff_dst"], inputs["mean"], inputs["variance"], inputs.get("gamma"),
                                 epsilon=epsilon, data_format=canonical, training=not inference,
                                 variance_is_invstd=variance_is_invstd)
            result = compute_core.backward(op, compute_core.Settings(
                outputs=outputs, block_bytes=block_size, threads=threads, progress=on_progress, core=core))
            arrays, ran = {name: getattr(result, name) for name in outputs}, result.core
            stats = {name: result.stats[name] for name in outputs if name in result.stats}  # from the write pass
        elapsed = time.perf_counter() - started
        if progress_bar:
            progress_bar.stop()
        if not stream:
            _write_outputs(arrays, output, out_dir, fsync)

        facts = RunFacts(spec=profile.name, data_format=data_format.upper(), canonical_format=canonical,
                         epsilon=None if variance_is_invstd else epsilon, training=not inference,
                         inputs=inputs, outputs=arrays,
                         written=[str(p) for p in destinations] or (["-"] if output == "-" else []),
                         elapsed_s=elapsed, core=ran, stream=stream, stats=stats)
        stdout_busy = output == "-" or json_target == "-"
        report_console = _console(stderr=stdout_busy) if not quiet or reference is not None else None
        if json_target and reference is None:
            files_write.write_text(json_target, run_json(facts) + "\n", fsync=fsync)
        if not quiet:
            render_run(report_console, stderr_console, facts)
        if reference is not None:
            from bnbwd_cli.judge.model import BackwardInputs

            # The file is the kernel under test (actual); bnbwd's outputs are the reference, and the inputs give
            # every element its error scale (streamed inputs are read whole here: the judge needs them).
            full = {name: read_array(sources[name], name) if isinstance(value, files_blocks.NpyBlocks) else value
                    for name, value in inputs.items()}
            problem = BackwardInputs(full["src"], full["diff_dst"], full["mean"], full["variance"], full.get("gamma"),
                                     epsilon=epsilon, data_format=canonical, training=not inference,
                                     variance_is_invstd=variance_is_invstd)
            kernel = read_tensor_set(reference)
            check_found(bf16_outputs, reinterpret_bf16(bf16_outputs, {reference: kernel}), reference)
            code = report_comparison(kernel, arrays, comparison, report_console, json_target,
                                     actual_label=reference, reference_label="bnbwd run", data_format=canonical,
                                     inputs=problem, fsync=fsync)
            click.get_current_context().exit(code)


def _write_outputs(arrays: dict[str, np.ndarray], output: str | None, out_dir: Path | None, fsync: bool) -> None:
    """In-memory outputs: an .npz (a file, a FIFO or device, or stdout) or a directory of .npy files."""
    if output == "-":
        files_write.write_stdout(files_write.npz_bytes(arrays))
    elif output is not None:
        files_write.write_npz(Path(output), arrays, fsync=fsync)
    elif out_dir is not None:
        files_write.write_npy_dir(out_dir, arrays, fsync=fsync)


def _run_streamed(inputs: dict, run_options, output: str | None, out_dir: Path | None, fsync: bool, progress,
                  keep_diff_src: bool) -> tuple[dict, dict, str]:
    """--stream: diff_src written by blocks into a temp file, committed with the other outputs, all or nothing.

    Returns (outputs, stats of the streamed ones, core that ran); a streamed diff_src is a shape-only stand-in
    unless `keep_diff_src` (then it is read back, for --reference).
    """
    import tempfile  # only here: it costs start-up time that `run` without --stream need not pay

    src = inputs["src"]
    want_diff_src = "diff_src" in run_options.outputs
    with contextlib.ExitStack() as stack:
        if out_dir is not None:
            outset = stack.enter_context(files_write.OutputSet(fsync=fsync))
            staged_path = out_dir / "diff_src.npy"
        else:
            outset = stack.enter_context(files_write.staging())
            destination = Path(output)
            directory = Path(tempfile.gettempdir()) if files_write.is_write_through(destination) else destination.parent
            staged_path = directory / f"{destination.name}.diff_src.npy"
        writer = outset.new_npy(staged_path, src.shape, src.dtype) if want_diff_src else None
        result = streaming.run_streamed(inputs, run_options, writer, progress)
        arrays = {name: getattr(result, name) for name in run_options.outputs if name != "diff_src"}
        stats = {}
        if writer is not None:
            diff_src = writer.read_all() if keep_diff_src else np.broadcast_to(np.zeros((), src.dtype), src.shape)
            arrays = {"diff_src": diff_src, **arrays}
            stats["diff_src"] = result.diff_src_stats
        if out_dir is not None:
            files_write.write_npy_dir(out_dir, {k: v for k, v in arrays.items() if k != "diff_src"}, outputs=outset)
        else:
            files_write.write_npz_with_streamed(destination, arrays, {"diff_src": writer} if writer else {}, fsync=fsync)
    return arrays, stats, result.core


def _resolve_epsilon(flag: float | None, attributes: dict, profile, variance_is_invstd: bool) -> float:
    """--epsilon, else the bundle's 'epsilon', else the spec's default; required unless variance is invstd."""
    epsilon = flag if flag is not None else attributes.get("epsilon", profile.default_epsilon)
    if epsilon is None:
        if variance_is_invstd:
            return 1.0  # unused: the variance input already is 1/sqrt(var + eps)
        raise click.UsageError(f"missing --epsilon (spec {profile.name} has no default and the bundle has no 'epsilon')")
    return check_epsilon(epsilon, profile)


main.add_command(verify)
main.add_command(with_run_options(check, run))
