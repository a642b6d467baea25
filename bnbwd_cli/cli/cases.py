"""`bnbwd cases -o DIR`: write a suite of input bundles that expose batch-norm backward bugs.

Click only: parse, call app/cases.write_suite, print what was written, exit 0 (or 3 on a bad
destination, with one line).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from bnbwd_cli.app import cases as app_cases
from bnbwd_cli.cli.params import FORMAT_CHOICE, ByteSize
from bnbwd_cli.literal import literal

_HELP = """Write a suite of test cases for your kernel: NAME.npz input bundles and a manifest.

Each NAME.npz holds src, diff_dst, mean, variance, gamma, a 0-d epsilon and
data_format (what `bnbwd run` reads). Your kernel reads it and writes
NAME.out.npz (diff_src, diff_gamma, diff_beta) beside it; bnbwd judges each case
(bnbwd_cli.check() in Python; README: "Test suites for your kernel"). The cases are chosen to
expose the bugs that N(0,1) data at one shape hides: M prime and M = k*block +- 1
(blocks 32..1024), C not a multiple of 8, N = 1, 1x1, non-square, 1-D and 3-D
images, |mean|/sd = 1e4, variance ~ epsilon, gamma 0 / 1 / varied, ReLU-masked
and global-average-pool gradients, coarse data, M ~ 1e5 for 16-bit sums.
DIR/manifest.txt says, one line per case, which bug classes it targets and why
its data exposes them; DIR/manifest.json says the same for programs.

\b
The same command writes the same bytes (for a given bnbwd version): the values
come from a fixed counter-based generator, the archives have a fixed date.
DIR must be new or empty; the suite appears there complete or not at all.
--dtype sets src and diff_dst (mean, variance, gamma are float32; bfloat16 is
stored as np.save stores it, raw 2-byte void). A --format that fixes a rank (NCHW,
NHWC, ...) keeps only the cases of that rank.

\b
--count K adds K generated cases after the preset's (seedS_0000, ...): shapes
of rank 2..5 and the data recipes above drawn from --seed S, each of at most
--max-elements elements per tensor; a nightly grows its suite with them, and
the same --seed and --count write the same bytes (--count 10 writes the first
10 of --count 500). bnbwd_cli.cases(...) holds the same cases in Python.
"""

_EPILOG = """\b
Examples:
  bnbwd cases -o suite
  bnbwd cases --dtype bf16 --format NHWC -o suite_bf16
  bnbwd cases --preset resnet50 --max-bytes 8M -o suite_resnet50
  bnbwd cases --seed 7 --count 500 --max-elements 4096 -o nightly
"""


@click.command("cases", help=_HELP, epilog=_EPILOG)
@click.option("-o", "--out", "out_dir", required=True, metavar="DIR", type=click.Path(path_type=Path),
              help="Directory to create (or an empty one) for the suite.")
@click.option("--dtype", type=click.Choice(list(app_cases.DTYPES), case_sensitive=False), default="f32",
              show_default=True, help="dtype of src and diff_dst.")
@click.option("--format", "data_format", type=FORMAT_CHOICE, default="NCX", show_default=True,
              help="Layout of src and diff_dst: NCX (NCHW...) or NXC (NHWC...).")
@click.option("--preset", type=click.Choice(list(app_cases.PRESETS)), default="default", show_default=True,
              help="default: ~30 small cases, a CI-sized suite (~4 MB in f32); tiny: the default cases of at most "
                   f"{app_cases.TINY_ELEMENTS} elements; resnet50: ResNet-50's batch-norm shapes, batch "
                   f"{app_cases.RESNET50_BATCH} (~110 MB in f32).")
@click.option("--max-bytes", type=ByteSize(), default=None, metavar="SIZE",
              help="Cap on the suite's size (e.g. 8M): the cases are taken in order, each one that would pass the "
                   "cap is left out, and the manifest names it.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Which generated cases --count adds (any integer >= 0; a nightly may use the date).")
@click.option("--count", type=click.IntRange(min=0), default=0, show_default=True,
              help="Generated cases to add after the preset's.")
@click.option("--max-elements", type=click.IntRange(min=app_cases.MIN_GENERATED_ELEMENTS),
              default=app_cases.GENERATED_ELEMENTS, show_default=True,
              help="Largest tensor of a generated case, in elements.")
def cases(out_dir: Path, dtype: str, data_format: str, **suite_options) -> None:
    # the other options (preset, max_bytes, seed, count, max_elements) are SuiteSettings' fields by name
    settings = app_cases.SuiteSettings(dtype=dtype.lower(), data_format=data_format.upper(), **suite_options)
    suite = app_cases.write_suite(settings, out_dir)
    click.echo(f"wrote {len(suite.cases)} cases ({_size(suite.nbytes)}) to {literal(out_dir)}; "
               f"{literal(out_dir / app_cases.MANIFEST_TEXT)} says what each one targets")
    if suite.left_out:
        click.echo(f"left out {len(suite.left_out)} (the manifest says why): "
                   + ", ".join(name for name, _ in suite.left_out))
    click.echo("next: your kernel reads each NAME.npz and writes NAME.out.npz (diff_src, diff_gamma, diff_beta) "
               "beside it (or, in Python: bnbwd_cli.cases(...)); then judge them all:")
    click.echo(f"  bnbwd check {shlex.quote(str(out_dir))}")


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"
