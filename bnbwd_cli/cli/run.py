"""`bnbwd run`: parse, gather inputs, call the core once, write, render (and judge with --reference)."""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import click
import numpy as np

from bnbwd_cli import core as compute_core
from bnbwd_cli import streaming
from bnbwd_cli.case import read_inputs
from bnbwd_cli.cli.main import CONTEXT, echo_error
from bnbwd_cli.cli.params import (FORMAT_CHOICE, MIN_BLOCK_BYTES, ArraySource, ByteSize, ComparisonOptions, OutputList,
                                  comparison_options, fsync_option)
from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files import blocks as files_blocks
from bnbwd_cli.files import write as files_write
from bnbwd_cli.files.npy import read_declared
from bnbwd_cli.files.read import declared_array, read_array, read_tensor_set, source_files
from bnbwd_cli.files.reinterpret import check_found, reinterpret_bf16
from bnbwd_cli.spec import INPUT_NAMES, OUTPUT_NAMES, PROFILES, resolve_epsilon, validate_inputs
from bnbwd_cli.run_summary import RunFacts

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
output_delta, y_backprop, reserve_space_1, reserve_space_2, scale, offset),
plus optional 0-d 'epsilon' and 'data_format'. A flag overrides the bundle.
PATH is FILE.npy, FILE.npz:key, FILE.safetensors[:key], raw:DTYPE:SHAPE:FILE for a headerless dump (e.g.
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
    bf16_inputs: tuple[str, ...]
    threads: int | None
    block_size: int | None
    core: str
    json_target: str | None
    quiet: bool
    stream: bool | None
    fsync: bool
    reference: str | None
    comparison: ComparisonOptions

    @property
    def sources(self) -> dict[str, str]:
        """The inputs given by flag (--src ...), by canonical name."""
        values = (self.src, self.diff_dst, self.mean, self.variance, self.gamma, self.beta)
        return {name: value for name, value in zip(INPUT_NAMES, values) if value}

    @property
    def bf16_outputs(self) -> list[str]:
        """--bf16 keys that are not inputs: keys of the kernel's outputs (--reference)."""
        return [key for key in self.bf16_inputs if key not in INPUT_NAMES]

    @property
    def has_file_output(self) -> bool:
        return self.out_dir is not None or (self.output is not None and self.output != "-")


@dataclass
class Prepared:
    """The op as read and checked: inputs (arrays, or NpyBlocks when streamed) and the resolved attributes."""

    inputs: dict
    data_format: str  # as given (e.g. NHWC)
    canonical: str  # NCX or NXC
    epsilon: float
    stream: bool

    def op_fields(self, options: RunOptions) -> dict:
        """The keyword arguments core.Op and streaming.StreamedRun share."""
        return {"epsilon": self.epsilon, "data_format": self.canonical, "training": not options.inference,
                "variance_is_invstd": options.variance_is_invstd}

    def arrays(self, inputs: dict | None = None) -> tuple:
        """src, diff_dst, mean, variance, gamma (None when absent): the op's positional arrays."""
        inputs = self.inputs if inputs is None else inputs
        return inputs["src"], inputs["diff_dst"], inputs["mean"], inputs["variance"], inputs.get("gamma")


@dataclass(frozen=True)
class Computed:
    arrays: dict[str, np.ndarray]
    stats: dict
    core: str
    elapsed_s: float


@click.command("run", epilog=RUN_EPILOG, context_settings=CONTEXT)
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
              "[default: on when src and diff_dst are .npy files over 1/4 of available memory, or over 256 MiB where "
              "a block of channels is read in long runs (not channels last or small planes), and the output is a file]")
@fsync_option
@click.option("--reference", metavar="KERNEL_OUT", help="Judge KERNEL_OUT (your kernel's outputs: .npz, .npy or a "
              "directory) against bnbwd's, by the problem's own error scale, as `bnbwd verify --inputs` does; exit 1 "
              "on mismatch. The options below tune it (--map THEIRS=OURS also renames the bundle's inputs).")
@comparison_options(with_format=False, with_json=False)
def run(no_param_grads: bool, **kwargs) -> None:
    """Compute diff_src, diff_gamma and diff_beta from the forward input, the output gradient and the batch stats."""
    if no_param_grads:
        kwargs["outputs"] = ("diff_src",)
    options = RunOptions(**kwargs)
    _check_usage(options)
    destinations = _vet_paths(options)
    click.get_current_context().with_resource(files_write.one_commit())  # outputs and --json: one set (LIFO: before --out-dir's cleanup)
    with contextlib.ExitStack() as stack:
        prepared = _prepare(options, stack)
        stderr_console = None if options.quiet else _console(stderr=True)
        computed = _compute(options, prepared, stack, stderr_console)
        written = [files_write.display(p) for p in destinations] or (["-"] if options.output == "-" else [])  # \xff: not UTF-8
        facts = RunFacts(spec=options.spec, data_format=prepared.data_format.upper(), canonical_format=prepared.canonical,
                         epsilon=None if options.variance_is_invstd else prepared.epsilon, training=not options.inference,
                         inputs=prepared.inputs, outputs=computed.arrays, written=written, elapsed_s=computed.elapsed_s,
                         core=computed.core, stream=prepared.stream, stats=computed.stats)
        stdout_busy = options.output == "-" or options.json_target == "-"
        report_console = _console(stderr=stdout_busy) if not options.quiet or options.reference is not None else None
        if options.json_target and options.reference is None:
            from bnbwd_cli.render import json as report_json  # only --json writes JSON

            files_write.write_text(options.json_target, report_json.document_text(report_json.run_document(facts)),
                                   fsync=options.fsync)
        if not options.quiet:
            from bnbwd_cli.render.run import render_run

            render_run(report_console, stderr_console, facts)
        if options.reference is not None:
            click.get_current_context().exit(_judge_reference(options, prepared, computed.arrays, report_console))


def _check_usage(options: RunOptions) -> None:
    """Usage errors (exit 2) that the flags alone show, before any file is read."""
    stdin_users = [name for name, value in [("BUNDLE", options.bundle), *options.sources.items()] if value == "-"]
    if len(stdin_users) > 1:
        raise click.UsageError(f"only one input can come from stdin ('-'), got {', '.join(stdin_users)}")
    if options.output is not None and options.out_dir is not None:
        raise click.UsageError("give -o/--output or --out-dir, not both")
    if options.output == "-" and options.json_target == "-":
        raise click.UsageError("-o - and --json - both want stdout; send one to a file")
    if options.output == "-" and sys.stdout.isatty():
        raise click.UsageError("refusing to write binary .npz data to a terminal; redirect stdout or use -o FILE")
    if options.core == "numba" and not compute_core.numba_available():
        raise click.UsageError("--core numba needs numba, which is not installed: pip install 'bnbwd[fast]'")
    if options.bf16_outputs and options.reference is None:
        raise click.UsageError(f"--bf16 {options.bf16_outputs[0]}: not an input ({', '.join(INPUT_NAMES)}); "
                               "a kernel output's key needs --reference KERNEL_OUT")


def _vet_paths(options: RunOptions) -> list[Path]:
    """The output files, checked against every file the run reads (no output overwrites an input)."""
    if options.out_dir is not None:  # made when missing (mkdir -p), removed again if the run fails
        click.get_current_context().with_resource(files_write.output_directory(options.out_dir))
    input_paths = _input_paths(options) + _reference_paths(options)
    destinations = files_write.vet_destinations(_output_paths(options), input_paths)
    json_target = options.json_target
    if json_target is not None and json_target != "-":
        json_path = files_write.vet_destination(json_target, input_paths, "--json")
        if any(json_path.resolve() == path.resolve() for path in destinations):
            raise click.UsageError(f"--json {json_target} is also the output file; give it another name")
    if options.reference is not None and not Path(options.reference).exists():
        raise BnbwdError(f"reference {options.reference}: no such file or directory")
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


def _prepare(options: RunOptions, stack: contextlib.ExitStack) -> Prepared:
    """Read the bundle and the flagged inputs (streamed ones as blocks), resolve format and epsilon, validate."""
    profile = PROFILES[options.spec]
    split = read_inputs(options.bundle, options.comparison.judging.key_map, declared=True) if options.bundle else None
    inputs, attributes = (split.inputs, split.attributes) if split else ({}, {})
    if split and split.note() and not options.quiet:
        echo_error(f"note: bundle ({options.bundle}): {split.note()}")
    data_format = options.data_format or attributes.get("data_format") or profile.default_format
    stream = options.stream
    # Large .npy inputs stream by themselves (unless their blocks would be short runs). With --core numba only those
    # too large to load safely do, and then the refusal below says why.
    if stream is None:
        stream = options.has_file_output and streaming.should_stream(options.sources, data_format,
                                                                     memory_only=options.core == "numba")
    if stream and not options.has_file_output:
        raise click.UsageError("--stream writes diff_src through a file: give -o OUT.npz or --out-dir DIR")
    for name, source in options.sources.items():
        blocks = files_blocks.open_npy_blocks(source, name) if stream and name in ("src", "diff_dst") else None
        if blocks is not None:
            stack.callback(blocks.close)
        inputs[name] = blocks if blocks is not None else declared_array(source, name)
    bf16_names = [key for key in options.bf16_inputs if key in INPUT_NAMES]
    check_found(bf16_names, reinterpret_bf16(bf16_names, {"the inputs": inputs}), "the inputs")
    epsilon = _resolve_epsilon(options.epsilon, attributes, profile, options.variance_is_invstd)
    read_declared(inputs, keep=("src", "diff_dst"))  # large src/diff_dst: checked by their headers before a read
    canonical = validate_inputs(inputs, profile, data_format, variance_is_invstd=options.variance_is_invstd,
                                outputs=options.outputs)
    if read_declared(inputs):
        canonical = validate_inputs(inputs, profile, data_format, variance_is_invstd=options.variance_is_invstd,
                                    outputs=options.outputs)
    if profile.paired_param_grads and "diff_gamma" not in options.outputs:
        inputs.pop("gamma", None)  # oneDNN Graph: without diff_gamma/diff_beta, gamma is ignored
    return Prepared(inputs, data_format, canonical, epsilon, stream)


def _compute(options: RunOptions, prepared: Prepared, stack: contextlib.ExitStack, stderr_console) -> Computed:  # noqa: ANN001
    """Run the backward pass once (in memory, or streamed through the output file) and write the outputs."""
    progress_bar, on_progress = None, None
    if stderr_console is not None and stderr_console.is_terminal and prepared.inputs["src"].nbytes >= PROGRESS_MIN_BYTES:
        from bnbwd_cli.render.run import progress_bar as make_bar  # rich: only when a bar shows

        progress_bar, on_progress = make_bar(stderr_console)
    started = time.perf_counter()
    if progress_bar:
        stack.callback(progress_bar.stop)
        progress_bar.start()
    if prepared.stream:
        arrays, stats, ran = _run_streamed(options, prepared, on_progress)
    else:
        op = compute_core.Op(*prepared.arrays(), **prepared.op_fields(options))
        result = compute_core.backward(op, compute_core.Settings(
            outputs=options.outputs, block_bytes=options.block_size, threads=options.threads, progress=on_progress,
            core=options.core))
        arrays, ran = {name: getattr(result, name) for name in options.outputs}, result.core
        stats = {name: result.stats[name] for name in options.outputs if name in result.stats}  # from the write pass
    elapsed = time.perf_counter() - started
    if progress_bar:
        progress_bar.stop()
    if not prepared.stream:
        _write_outputs(arrays, options)
    return Computed(arrays, stats, ran, elapsed)


def _judge_reference(options: RunOptions, prepared: Prepared, arrays: dict, console) -> int:  # noqa: ANN001
    """--reference: the file is the kernel under test (actual), bnbwd's outputs the reference; exit code back."""
    from bnbwd_cli.cli.verify import TensorSets, report_comparison  # verify's module: only when judging

    # The inputs give every element its error scale (streamed inputs are read whole here: the judge needs them).
    full = {name: read_array(options.sources[name], name) if isinstance(value, files_blocks.NpyBlocks) else value
            for name, value in prepared.inputs.items()}
    problem = compute_core.Op(*prepared.arrays(full), **prepared.op_fields(options))
    kernel = read_tensor_set(options.reference)
    check_found(options.bf16_outputs, reinterpret_bf16(options.bf16_outputs, {options.reference: kernel}),
                options.reference)
    sets = TensorSets(kernel, arrays, actual_label=options.reference, reference_label="bnbwd run", inputs=problem)
    comparison = replace(options.comparison, data_format=prepared.canonical)  # run's --format names the axes
    return report_comparison(sets, comparison, console, options.json_target, fsync=options.fsync)


def _write_outputs(arrays: dict[str, np.ndarray], options: RunOptions) -> None:
    """In-memory outputs: an .npz (a file, a FIFO or device, or stdout) or a directory of .npy files."""
    if options.output == "-":
        files_write.write_stdout(files_write.npz_bytes(arrays))
    elif options.output is not None:
        files_write.write_npz(Path(options.output), arrays, fsync=options.fsync)
    elif options.out_dir is not None:
        files_write.write_npy_dir(options.out_dir, arrays, fsync=options.fsync)


def _run_streamed(options: RunOptions, prepared: Prepared, progress) -> tuple[dict, dict, str]:  # noqa: ANN001
    """--stream: diff_src written by blocks into a temp file, committed with the other outputs, all or nothing.

    Returns (outputs, stats of the streamed ones, core that ran); a streamed diff_src is a shape-only stand-in
    unless --reference needs it (then it is read back).
    """
    import tempfile  # only here: it costs start-up time that `run` without --stream need not pay

    src = prepared.inputs["src"]
    run_options = streaming.StreamedRun(**prepared.op_fields(options), outputs=options.outputs,
                                        block_bytes=options.block_size, threads=options.threads, core=options.core)
    out_dir, fsync = options.out_dir, options.fsync
    with contextlib.ExitStack() as stack:
        if out_dir is not None:
            outset = stack.enter_context(files_write.OutputSet(fsync=fsync))
            staged_path = out_dir / "diff_src.npy"
        else:
            outset = stack.enter_context(files_write.staging())
            destination = Path(options.output)
            directory = Path(tempfile.gettempdir()) if files_write.is_write_through(destination) else destination.parent
            staged_path = directory / f"{destination.name}.diff_src.npy"
        writer = outset.new_npy(staged_path, src.shape, src.dtype) if "diff_src" in options.outputs else None
        result = streaming.run_streamed(prepared.inputs, run_options, writer, progress)
        arrays = {name: getattr(result, name) for name in options.outputs if name != "diff_src"}
        stats = {}
        if writer is not None:
            keep = options.reference is not None
            diff_src = writer.read_all() if keep else np.broadcast_to(np.zeros((), src.dtype), src.shape)
            arrays = {"diff_src": diff_src, **arrays}
            stats["diff_src"] = result.diff_src_stats
        if out_dir is not None:
            files_write.write_npy_dir(out_dir, {k: v for k, v in arrays.items() if k != "diff_src"}, outputs=outset)
        else:
            files_write.write_npz_with_streamed(destination, arrays, {"diff_src": writer} if writer else {}, fsync=fsync)
    return arrays, stats, result.core


def _resolve_epsilon(flag: float | None, attributes: dict, profile, variance_is_invstd: bool) -> float:
    """--epsilon, else the bundle's 'epsilon', else the spec's default; required unless variance is invstd."""
    epsilon = resolve_epsilon(flag if flag is not None else attributes.get("epsilon"), profile, variance_is_invstd)
    if epsilon is None:
        raise click.UsageError(f"missing --epsilon (spec {profile.name} has no default and the bundle has no 'epsilon')")
    return epsilon


def _console(stderr: bool):
    """A rich console, imported here: `run -q` renders nothing and never loads rich (tests/test_startup.py)."""
    from bnbwd_cli.render.text import make_console

    return make_console(stderr=stderr)
