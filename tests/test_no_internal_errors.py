"""Exit 4 means a bug in bnbwd, never an input, an option value or an environment setting bnbwd reads (issue 35's
round): a 1 MiB string entry, --stream with zero elements, numba's own settings, 5,000-digit counts and sizes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import assert_one_error, make_inputs, save_bundle, save_npy_flags

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "fixtures" / "example.npz"
DIGITS = "9" * 5000


@pytest.mark.parametrize("key", ["data_format", "is_training"])
def test_a_one_mib_string_entry_in_a_run_bundle_is_an_input_error(cli, tmp_path: Path, rng, key: str) -> None:
    """A string entry of 1 MiB arrived unread (as large inputs do) and `.item()` failed on it: exit 4."""
    bundle = save_bundle(tmp_path / "b.npz", make_inputs(rng, (2, 3, 4, 4)), epsilon=1e-3,
                         **{key: "N" * (1 << 20)})
    result = cli("run", bundle, "-q", "-o", tmp_path / "out.npz")
    assert_one_error(result, rf"'{key}' is a string of up to 1048576 characters .*expected a short entry")
    assert not (tmp_path / "out.npz").exists()


@pytest.mark.parametrize("data_format, shape", [("NCHW", (0, 3, 4, 4)), ("NCHW", (2, 3, 0, 4)),
                                                ("NHWC", (0, 4, 4, 3)), ("NHWC", (2, 4, 0, 3))])
def test_stream_with_zero_elements_gives_the_in_memory_outputs(cli, tmp_path: Path, rng, data_format: str,
                                                               shape: tuple[int, ...]) -> None:
    """N = 0 or an empty spatial axis worked without --stream and was exit 4 with it."""
    layout = "NCX" if data_format == "NCHW" else "NXC"
    flags = save_npy_flags(tmp_path, make_inputs(rng, shape, layout))
    outputs = {}
    for stream in ([], ["--stream"]):
        out = tmp_path / ("streamed" if stream else "in-memory")
        result = cli("run", *flags, "--epsilon", "1e-3", "--format", data_format, "-q", *stream, "--out-dir", out)
        assert result.exit_code == 0, result.output
        outputs[bool(stream)] = {p.name: p.read_bytes() for p in out.iterdir()}
    assert outputs[True] == outputs[False] and len(outputs[True]) == 3
    assert np.load(tmp_path / "streamed" / "diff_src.npy").shape == shape


# numba's settings are read by numba itself, in a fresh process; AUTO lowers core=auto's threshold so that the
# example's 1152 elements go to numba as a large input would.
NUMBA_SCRIPT = """
import sys
from pathlib import Path
from bnbwd_cli import runtime
if sys.argv[1] == "no-home":
    def no_home():
        raise RuntimeError("Could not determine home directory.")
    Path.home = staticmethod(no_home)
runtime.AUTO_NUMBA_MIN_ELEMENTS = 0
from bnbwd_cli.cli import main
main(sys.argv[2:], prog_name="bnbwd")
"""


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba not installed")
@pytest.mark.parametrize("core", ["numba", "auto"])
@pytest.mark.parametrize("setting", ["NUMBA_NUM_THREADS=0", "NUMBA_THREADING_LAYER=tbb", "no-home"])
def test_numba_settings_that_keep_it_from_starting_fall_back_to_the_numpy_core(tmp_path: Path, core: str,
                                                                                setting: str) -> None:
    if setting.endswith("tbb") and importlib.util.find_spec("tbb") is not None:
        pytest.skip("tbb is installed here: the layer loads")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_") and k not in ("HOME", "XDG_CACHE_HOME")}
    env.update(PYTHONPATH=str(ROOT), HOME=os.environ.get("HOME", "/"), BNBWD_CORE="")
    if "=" in setting:
        env.update([setting.split("=")])
    else:
        env.pop("HOME")
    out = tmp_path / f"{core}.npz"
    result = subprocess.run([sys.executable, "-c", NUMBA_SCRIPT, setting, "run", str(BUNDLE), "-q", "--core", core,
                             "-o", str(out)], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [note] = result.stderr.splitlines()
    assert note.startswith("note: numba cannot start here (") and note.endswith("the NumPy core ran instead (the "
                                                                                  "same bits, slower)")
    reference = tmp_path / "numpy.npz"
    assert subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", str(BUNDLE), "-q", "--core", "numpy", "-o",
                           str(reference)], timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)}).returncode == 0
    assert out.read_bytes() == reference.read_bytes()


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba not installed")
def test_the_judging_falls_back_too_when_numba_cannot_start(tmp_path: Path) -> None:
    """$BNBWD_CORE=numba asks the judge's bias sums for numba as well: with NUMBA_NUM_THREADS=0 their import
    failed as an internal error (exit 4) while the core had fallen back. Now both fall back, with the one note."""
    cases = ROOT / "fixtures" / "cases"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_NUM_THREADS": "0", "BNBWD_CORE": "numba"}
    result = subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", str(cases / "bn1.npz"), "-q", "--reference",
                             str(cases / "bn1.out.npz"), "--brief"], capture_output=True, text=True, timeout=120,
                            env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("PASS: 3 output(s) within tolerance")
    [note] = result.stderr.splitlines()
    assert note.startswith("note: numba cannot start here (ValueError: ") and note.endswith("the NumPy core ran "
                                                                                              "instead (the same bits, slower)")


@pytest.mark.parametrize("args", [["check", str(ROOT / "fixtures" / "cases"), "--shard", f"1/{DIGITS}"],
                                  ["check", str(ROOT / "fixtures" / "cases"), "--shard", f"{DIGITS}/{DIGITS}"],
                                  ["run", str(BUNDLE), "-q", "-o", "{out}", "--block-size", DIGITS],
                                  ["run", str(BUNDLE), "-q", "-o", "{out}", "--block-size", f"{DIGITS}K"],
                                  ["cases", "-o", "{out}", "--max-bytes", DIGITS]], ids=["shard-n", "shard-k",
                                                                                        "block-size", "block-size-k",
                                                                                        "max-bytes"])
def test_a_5000_digit_count_or_size_is_a_usage_error(cli, tmp_path: Path, args: list[str]) -> None:
    """Python's int() refuses more than 4300 digits with a ValueError that reached the group: exit 4."""
    result = cli(*[arg.format(out=tmp_path / "out") for arg in args])
    assert_one_error(result, r"Invalid value for '--(shard|block-size|max-bytes)'", code=2)
    assert not (tmp_path / "out").exists()
