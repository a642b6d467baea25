"""`bnbwd run` through the real CLI: every option, and every bad input with its exit code and message."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from bnbwd_cli.core import Op

from bnbwd_cli.core.reference import reference_backward
from tests.conftest import assert_one_error, load_npz, make_inputs, save_bundle, save_npy_flags
from tests.oracle import BOUNDS, normalised_error

INPUT_FLAGS = ("src", "diff_dst", "mean", "variance", "gamma", "beta")


@pytest.fixture
def bundle(tmp_path, rng):
    """An NCHW f32 bundle with epsilon and data_format inside, and its inputs."""
    arrays = make_inputs(rng, (3, 4, 5, 6), "NCX")
    return save_bundle(tmp_path / "in.npz", arrays, epsilon=1e-3, data_format="NCHW"), arrays


def expect_oracle(outputs: dict, arrays: dict, data_format="NCX", epsilon=1e-3, training=True, invstd=False,
                  gamma=True) -> None:
    expected = reference_backward(Op(arrays["src"], arrays["diff_dst"], arrays["mean"], arrays["variance"],
                                  arrays.get("gamma") if gamma else None, epsilon=epsilon, data_format=data_format,
                                  training=training, variance_is_invstd=invstd))
    for name, array in outputs.items():
        bound = BOUNDS[np.dtype(array.dtype).name]
        assert normalised_error(array, expected[name]) <= bound, name


# ------------------------------------------------------------------ options that work


def test_bundle_to_npz_matches_oracle(cli, bundle, tmp_path):
    path, arrays = bundle
    result = cli("run", path, "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    outputs = load_npz(tmp_path / "out.npz")
    assert set(outputs) == {"diff_src", "diff_gamma", "diff_beta"}
    expect_oracle(outputs, arrays)
    assert "diff_src" in result.stdout and "NCHW" in result.stdout


def test_per_input_flags_and_npz_keys(cli, tmp_path, rng):
    arrays = make_inputs(rng, (2, 7, 3), "NXC")
    np.savez(tmp_path / "stats.npz", m=arrays["mean"], v=arrays["variance"])
    for name in ("src", "diff_dst", "gamma"):
        np.save(tmp_path / f"{name}.npy", arrays[name])
    result = cli("run", "--src", tmp_path / "src.npy", "--diff-dst", tmp_path / "diff_dst.npy",
                 "--mean", f"{tmp_path}/stats.npz:m", "--variance", f"{tmp_path}/stats.npz:v",
                 "--gamma", tmp_path / "gamma.npy", "--epsilon", "1e-3", "--format", "nwc",
                 "--out-dir", tmp_path)
    assert result.exit_code == 0, result.output
    outputs = {name: np.load(tmp_path / f"{name}.npy") for name in ("diff_src", "diff_gamma", "diff_beta")}
    expect_oracle(outputs, arrays, data_format="NXC")


def test_flag_overrides_bundle(cli, bundle, tmp_path):
    path, arrays = bundle
    np.save(tmp_path / "g.npy", arrays["gamma"] * 2)
    plain = cli("run", path, "-o", tmp_path / "a.npz")
    doubled = cli("run", path, "--gamma", tmp_path / "g.npy", "-o", tmp_path / "b.npz")
    assert plain.exit_code == doubled.exit_code == 0
    a, b = load_npz(tmp_path / "a.npz"), load_npz(tmp_path / "b.npz")
    np.testing.assert_allclose(b["diff_src"], 2 * a["diff_src"], rtol=1e-6)


@pytest.mark.parametrize("aliases", [
    {"src": "input", "diff_dst": "normalized_delta"},
    {"src": "input_forward", "diff_dst": "output_delta"},
    {"src": "x", "diff_dst": "y_backprop", "mean": "reserve_space_1", "variance": "reserve_space_2",
     "gamma": "scale"},
], ids=["ngraph", "openvino", "tensorflow"])
def test_spec_aliases_in_bundle(cli, tmp_path, rng, aliases):
    arrays = make_inputs(rng, (2, 3, 4, 4), "NCX")
    renamed = {aliases.get(name, name): array for name, array in arrays.items()}
    path = save_bundle(tmp_path / "in.npz", renamed, epsilon=1e-3, data_format="NCHW")
    result = cli("run", path, "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    expect_oracle(load_npz(tmp_path / "out.npz"), arrays)


def test_stdin_input_and_stdout_output(cli, bundle, tmp_path):
    path, arrays = bundle
    buffer = io.BytesIO()
    np.save(buffer, arrays["diff_dst"])
    result = cli("run", path, "--diff-dst", "-", "-o", "-", "-q", input=buffer.getvalue())
    assert result.exit_code == 0, result.stderr
    outputs = load_npz(io.BytesIO(result.stdout_bytes))
    expect_oracle(outputs, arrays)


def test_bundle_from_stdin(cli, bundle, tmp_path):
    path, arrays = bundle
    with open(path, "rb") as stream:
        result = cli("run", "-", "-o", tmp_path / "out.npz", input=stream.read())
    assert result.exit_code == 0, result.output
    expect_oracle(load_npz(tmp_path / "out.npz"), arrays)


@pytest.mark.parametrize("fmt,shape,layout", [
    ("NC", (9, 4), "NCX"), ("NCW", (2, 4, 5), "NCX"), ("NWC", (2, 5, 4), "NXC"), ("NCHW", (2, 4, 3, 3), "NCX"),
    ("NHWC", (2, 3, 3, 4), "NXC"), ("NCDHW", (2, 4, 2, 2, 2), "NCX"), ("NDHWC", (2, 2, 2, 2, 4), "NXC"),
    ("NCX", (2, 4, 2, 2, 2, 2), "NCX"), ("nxc", (2, 2, 2, 2, 2, 4), "NXC"),
])
def test_format_aliases(cli, tmp_path, rng, fmt, shape, layout):
    arrays = make_inputs(rng, shape, layout)
    path = save_bundle(tmp_path / "in.npz", arrays)
    result = cli("run", path, "--format", fmt, "--epsilon", "1e-3", "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    expect_oracle(load_npz(tmp_path / "out.npz"), arrays, data_format=layout)


def test_gamma_absent_is_one_and_beta_ignored(cli, tmp_path, rng):
    arrays = make_inputs(rng, (4, 3, 5), "NCX")
    without_gamma = {k: v for k, v in arrays.items() if k != "gamma"}
    path = save_bundle(tmp_path / "in.npz", without_gamma, epsilon=1e-3, data_format="NCX")
    result = cli("run", path, "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    expect_oracle(load_npz(tmp_path / "out.npz"), arrays, gamma=False)


def test_inference(cli, bundle, tmp_path):
    path, arrays = bundle
    result = cli("run", path, "--inference", "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    expect_oracle(load_npz(tmp_path / "out.npz"), arrays, training=False)
    assert "inference" in result.stdout


def test_variance_is_invstd(cli, tmp_path, rng):
    arrays = make_inputs(rng, (3, 4, 6), "NCX")
    invstd = dict(arrays, variance=(1 / np.sqrt(arrays["variance"].astype(np.float64) + 1e-3)).astype(np.float32))
    path = save_bundle(tmp_path / "in.npz", invstd, data_format="NCX")  # no epsilon needed
    result = cli("run", path, "--variance-is-invstd", "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    expect_oracle(load_npz(tmp_path / "out.npz"), arrays, epsilon=1e-3)


@pytest.mark.parametrize("flags,expected", [
    (["--no-param-grads"], {"diff_src"}),
    (["--outputs", "diff_gamma,diff_beta"], {"diff_gamma", "diff_beta"}),
    (["--outputs", "diff_beta"], {"diff_beta"}),
])
def test_output_selection(cli, bundle, tmp_path, flags, expected):
    path, arrays = bundle
    result = cli("run", path, *flags, "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    outputs = load_npz(tmp_path / "out.npz")
    assert set(outputs) == expected
    expect_oracle(outputs, arrays)


def test_bf16_round_trip_and_dtypes(cli, tmp_path, rng):
    arrays = make_inputs(rng, (2, 5, 4, 4), "NXC", dtype=ml_dtypes.bfloat16, stats_dtype=ml_dtypes.bfloat16)
    path = save_bundle(tmp_path / "in.npz", arrays, epsilon=1e-3)
    result = cli("run", path, "--spec", "openvino", "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    with np.load(tmp_path / "out.npz") as archive:
        assert archive["diff_src"].dtype == np.dtype("V2")  # as np.save stores bfloat16
    from bnbwd_cli.files.read import read_tensor_set

    outputs = read_tensor_set(str(tmp_path / "out.npz"))
    assert all(array.dtype == ml_dtypes.bfloat16 for array in outputs.values())
    expect_oracle(outputs, arrays, data_format="NXC")


def test_bf16_flag_reinterprets_uint16(cli, tmp_path, rng):
    arrays = make_inputs(rng, (2, 3, 8), "NCX", dtype=ml_dtypes.bfloat16, stats_dtype=np.float32)
    raw = dict(arrays, src=arrays["src"].view(np.uint16), diff_dst=arrays["diff_dst"].view(np.uint16))
    path = save_bundle(tmp_path / "in.npz", raw, epsilon=1e-3, data_format="NCX")
    refused = cli("run", path, "-o", tmp_path / "out.npz")
    assert_one_error(refused, r"src has dtype uint16, expected a float type")
    result = cli("run", path, "--bf16", "src", "--bf16", "diff_dst", "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    assert result.exit_code == 0


def test_mixed_precision_generic(cli, tmp_path, rng):
    arrays = make_inputs(rng, (2, 3, 4, 4), "NCX", dtype=np.float16, stats_dtype=np.float64)
    path = save_bundle(tmp_path / "in.npz", arrays, epsilon=1e-3, data_format="NCHW")
    result = cli("run", path, "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    outputs = load_npz(tmp_path / "out.npz")
    assert outputs["diff_src"].dtype == np.float16 and outputs["diff_gamma"].dtype == np.float64


def test_json_summary(cli, bundle, tmp_path):
    path, _ = bundle
    result = cli("run", path, "-o", tmp_path / "out.npz", "--json", "-", "-q")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["schema_version"] == 1 and document["command"] == "run"
    assert document["outputs"]["diff_src"]["shape"] == [3, 4, 5, 6]
    assert document["written"] == [str(tmp_path / "out.npz")]
    result = cli("run", path, "--json", tmp_path / "facts.json", "-q")
    assert result.exit_code == 0 and result.stdout == ""
    assert json.loads((tmp_path / "facts.json").read_text())["epsilon"] == pytest.approx(1e-3)


@pytest.mark.parametrize("flags", [["--threads", "1"], ["--threads", "2", "--block-size", "4K"], ["--block-size", "1M"]])
def test_threads_and_block_size_do_not_change_results(cli, bundle, tmp_path, flags):
    path, arrays = bundle
    result = cli("run", path, *flags, "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    expect_oracle(load_npz(tmp_path / "out.npz"), arrays)


def test_help_has_examples(cli):
    result = cli("run", "--help")
    assert result.exit_code == 0
    assert "Examples:" in result.stdout and "--variance-is-invstd" in result.stdout and "bfloat16" in result.stdout


# ------------------------------------------------------------------ spec profiles


def test_tensorflow_defaults(cli, tmp_path, rng):
    arrays = make_inputs(rng, (2, 3, 3, 4), "NXC")
    path = save_bundle(tmp_path / "in.npz", arrays)  # no epsilon, no format: TF's 1e-4 and NHWC
    result = cli("run", path, "--spec", "tensorflow", "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    expect_oracle(load_npz(tmp_path / "out.npz"), arrays, data_format="NXC", epsilon=float(np.float32(1e-4)))


@pytest.mark.parametrize("spec,shape,layout,dtypes,extra,pattern", [
    ("ngraph", (2, 3, 4), "NXC", (np.float32, np.float32), ["--format", "NXC"], r"not allowed by spec ngraph"),
    ("ngraph", (2, 3, 4), "NCX", (np.float32, np.float64), [], r"gamma has dtype f64, expected f32|does not allow"),
    ("openvino", (2, 3, 4), "NXC", (np.float32, ml_dtypes.bfloat16), [], r"does not allow src f32 with mean/variance bf16"),
    ("openvino", (2, 3, 4), "NXC", (np.float64, np.float64), [], r"does not allow src f64"),
    ("onednn", (2, 3, 4), "NXC", (np.float16, np.float16), [], r"does not allow src f16 with mean/variance f16"),
    ("onednn", (2, 3, 4), "NXC", (np.float32, np.float32), ["--outputs", "diff_src,diff_gamma"], r"both or neither"),
    ("tensorflow", (2, 3, 4), "NXC", (np.float32, np.float32), [], r"NHWC needs a rank-4 src, found rank 3"),
    ("tensorflow", (2, 3, 3, 4), "NXC", (np.float32, np.float16), [], r"does not allow src f32 with mean/variance f16"),
], ids=["ngraph-nxc", "ngraph-mixed", "openvino-f32-bf16", "openvino-f64", "onednn-f16-f16", "onednn-one-grad",
        "tf-rank3", "tf-f16-stats"])
def test_spec_rejections(cli, tmp_path, rng, spec, shape, layout, dtypes, extra, pattern):
    arrays = make_inputs(rng, shape, layout, dtype=dtypes[0], stats_dtype=dtypes[1])
    if spec == "ngraph" and dtypes[1] != dtypes[0]:
        arrays = dict(arrays, mean=arrays["mean"].astype(dtypes[0]), variance=arrays["variance"].astype(dtypes[0]))
    path = save_bundle(tmp_path / "in.npz", arrays, epsilon=1e-3)
    result = cli("run", path, "--spec", spec, *extra, "-o", tmp_path / "out.npz")
    assert_one_error(result, pattern)
    assert not (tmp_path / "out.npz").exists()


def test_ngraph_requires_gamma_and_beta(cli, tmp_path, rng):
    arrays = make_inputs(rng, (2, 3, 4), "NCX")
    del arrays["beta"]
    path = save_bundle(tmp_path / "in.npz", arrays, epsilon=1e-3)
    assert_one_error(cli("run", path, "--spec", "ngraph"), r"missing input beta \(spec ngraph\)")


def test_ngraph_accepts_f64_ncx(cli, tmp_path, rng):
    arrays = make_inputs(rng, (2, 3, 4), "NCX", dtype=np.float64, stats_dtype=np.float64)
    path = save_bundle(tmp_path / "in.npz", arrays, epsilon=1e-3)
    result = cli("run", path, "--spec", "ngraph", "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    expect_oracle(load_npz(tmp_path / "out.npz"), arrays)


def test_onednn_without_param_grads_ignores_gamma(cli, tmp_path, rng):
    arrays = make_inputs(rng, (2, 3, 4), "NXC")
    path = save_bundle(tmp_path / "in.npz", arrays, epsilon=1e-3)
    result = cli("run", path, "--spec", "onednn", "--no-param-grads", "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    expect_oracle(load_npz(tmp_path / "out.npz"), arrays, data_format="NXC", epsilon=float(np.float32(1e-3)),
                  gamma=False)


# ------------------------------------------------------------------ bad input: exit 3, one line


def _bundle_with(tmp_path, rng, **changes):
    arrays = make_inputs(rng, (2, 4, 3, 3), "NCX")
    arrays.update({k: v for k, v in changes.items() if v is not None})
    for key in [k for k, v in changes.items() if v is None]:
        del arrays[key]
    return save_bundle(tmp_path / "in.npz", arrays, epsilon=1e-3, data_format="NCHW")


@pytest.mark.parametrize("change,pattern", [
    ({"src": np.zeros(5, np.float32)}, r"src has rank 1 .*expected rank >= 2"),
    ({"mean": np.zeros(3, np.float32)}, r"mean has shape \(3,\), expected \(4,\) = C of src \(NCX\)"),
    ({"variance": np.ones((4, 1), np.float32)}, r"variance has shape \(4, 1\), expected \(4,\)"),
    ({"gamma": np.ones(5, np.float32)}, r"gamma has shape \(5,\), expected \(4,\)"),
    ({"beta": np.ones(2, np.float32)}, r"beta has shape \(2,\), expected \(4,\)"),
    ({"diff_dst": np.zeros((2, 4, 3, 2), np.float32)}, r"diff_dst has shape \(2, 4, 3, 2\), expected \(2, 4, 3, 3\)"),
    ({"diff_dst": np.zeros((2, 4, 3, 3), np.float64)}, r"diff_dst has dtype f64, expected f32 = dtype of src"),
    ({"src": np.zeros((2, 4, 3, 3), np.int32)}, r"src has dtype int32, expected a float type"),
    ({"diff_dst": np.zeros((2, 4, 3, 3), np.complex64)}, r"diff_dst has dtype complex64"),
    ({"mean": np.zeros(4, bool)}, r"mean has dtype bool"),
    ({"variance": np.array([1, -1, 1, 1], np.float32)}, r"variance at c=1 is -1.0, expected >= 0"),
    ({"variance": np.array([1, 1, np.nan, 1], np.float32)}, r"variance at c=2 is nan"),
    ({"mean": None}, r"missing input mean"),
    ({"diff_dst": None}, r"missing input diff_dst"),
    ({"x": np.zeros((2, 4, 3, 3), np.float32)}, r"both 'src' and 'x' give src"),
], ids=["rank1", "C-mismatch-mean", "variance-2d", "gamma-C", "beta-C", "diff_dst-shape", "diff_dst-dtype", "int",
        "complex", "bool", "negative-variance", "nan-variance", "no-mean", "no-diff_dst",
        "duplicate-alias"])
def test_bad_inputs_exit_3(cli, tmp_path, rng, change, pattern):
    path = _bundle_with(tmp_path, rng, **change)
    result = cli("run", path, "-o", tmp_path / "out.npz")
    assert_one_error(result, pattern)
    assert not (tmp_path / "out.npz").exists()


@pytest.mark.parametrize("epsilon,pattern", [("0", r"epsilon is 0.0"), ("-1e-5", r"epsilon is -1e-05"),
                                             ("nan", r"epsilon is nan"), ("inf", r"epsilon is inf")])
def test_bad_epsilon(cli, bundle, epsilon, pattern):
    path, _ = bundle
    assert_one_error(cli("run", path, "--epsilon", epsilon), pattern + r", expected a finite number > 0")


def test_bad_epsilon_in_bundle(cli, tmp_path, rng):
    path = save_bundle(tmp_path / "in.npz", make_inputs(rng, (2, 3, 4), "NCX"), epsilon=-1.0, data_format="NCX")
    assert_one_error(cli("run", path), r"epsilon is -1.0")


def test_invstd_must_be_positive(cli, tmp_path, rng):
    arrays = make_inputs(rng, (2, 3, 4), "NCX")
    arrays["variance"][1] = 0
    path = save_bundle(tmp_path / "in.npz", arrays, data_format="NCX")
    assert_one_error(cli("run", path, "--variance-is-invstd"), r"variance \(as invstd\) at c=1 is 0.0")


def test_alias_rank_is_checked(cli, bundle):
    path, _ = bundle
    assert_one_error(cli("run", path, "--format", "NCDHW"), r"NCDHW needs a rank-5 src, found rank 4")


@pytest.mark.parametrize("content,pattern", [
    (b"not a zip at all", r"not an .npz archive"),
    (b"PK\x03\x04garbage", r"not a valid .npz archive"),
])
def test_unreadable_bundle(cli, tmp_path, content, pattern):
    (tmp_path / "bad.npz").write_bytes(content)
    assert_one_error(cli("run", tmp_path / "bad.npz"), pattern)


def test_truncated_npy(cli, bundle, tmp_path, rng):
    path, arrays = bundle
    np.save(tmp_path / "src.npy", arrays["src"])
    data = (tmp_path / "src.npy").read_bytes()
    (tmp_path / "src.npy").write_bytes(data[: len(data) - 10])
    assert_one_error(cli("run", path, "--src", tmp_path / "src.npy"), r"src .*declares shape \(3, 4, 5, 6\)")


def test_object_array_is_refused(cli, bundle, tmp_path):
    path, _ = bundle
    np.save(tmp_path / "evil.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    assert_one_error(cli("run", path, "--gamma", tmp_path / "evil.npy"), r"gamma .*refusing to unpickle")


def test_missing_file_and_key(cli, bundle, tmp_path):
    path, _ = bundle
    assert_one_error(cli("run", path, "--gamma", tmp_path / "nope.npy"), r"gamma .*no such file")
    assert_one_error(cli("run", path, "--gamma", f"{path}:nope"), r"no array 'nope' in the archive \(it has: ")


# ------------------------------------------------------------------ usage and output errors


def test_missing_epsilon_is_an_input_error(cli, tmp_path, rng):
    """Not click's own usage error: the bundle could have held it (tests/test_one_way_in.py: every command alike)."""
    path = save_bundle(tmp_path / "in.npz", make_inputs(rng, (2, 3, 4), "NCX"))
    assert_one_error(cli("run", path, "--format", "NCX"), r"no epsilon: .*; give --epsilon$")


@pytest.mark.parametrize("args,pattern", [
    (["--format", "NCHWX"], r"Invalid value for '--format'"),
    (["--spec", "caffe"], r"Invalid value for '--spec'"),
    (["--outputs", "diff_x"], r"expected a comma-separated subset"),
    (["--threads", "0"], r"Invalid value for '--threads'"),
    (["--block-size", "lots"], r"not a size"),
    (["-o", "a.npz", "--out-dir", "."], r"not both"),
    (["-o", "-", "--json", "-"], r"both want stdout"),
    (["--src", "-", "--diff-dst", "-"], r"only one input can come from stdin"),
], ids=["format", "spec", "outputs", "threads", "block-size", "o-and-out-dir", "two-stdout", "two-stdin"])
def test_usage_errors_exit_2(cli, bundle, args, pattern):
    path, _ = bundle
    result = cli("run", path, *args)
    assert result.exit_code == 2, result.output
    assert re.search(pattern, result.stderr), result.stderr


def test_refuses_to_overwrite_an_input(cli, bundle):
    path, _ = bundle
    before = open(path, "rb").read()
    assert_one_error(cli("run", path, "-o", path), r"is also an input .*refusing to overwrite")
    assert open(path, "rb").read() == before


def test_output_in_missing_directory(cli, bundle, tmp_path):
    path, _ = bundle
    assert_one_error(cli("run", path, "-o", tmp_path / "no" / "out.npz"), r"directory .* does not exist")
    assert_one_error(cli("run", path, "-o", tmp_path), r"is a directory")


def test_refuses_binary_to_a_terminal(bundle):
    import os
    import pty
    import subprocess
    import sys

    path, _ = bundle
    leader, follower = pty.openpty()
    try:
        result = subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", path, "-o", "-"], stdout=follower,
                                stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(follower)
        os.close(leader)
    assert result.returncode == 2
    assert b"refusing to write binary .npz data to a terminal" in result.stderr


@pytest.mark.parametrize("extra, streamed", [([], True), (["--core", "numpy"], True),
                                            pytest.param(["--core", "numba"], False, marks=pytest.mark.numba)])
def test_large_npy_inputs_stream_by_themselves(cli, tmp_path, rng, monkeypatch, extra, streamed):
    # Over STREAM_MIN_BYTES, .npy inputs are read and diff_src written by blocks of channels (the JSON says
    # so), with the same results; an explicit --core numba keeps them in memory instead of refusing.
    if "numba" in extra:
        pytest.importorskip("numba")
    from bnbwd_cli.app import streaming

    monkeypatch.setattr(streaming, "STREAM_MIN_BYTES", 1)
    arrays = make_inputs(rng, (3, 4, 5, 6), "NCX")
    flags = save_npy_flags(tmp_path, arrays)
    result = cli("run", *flags, "--epsilon", "1e-3", "--format", "NCHW", "-o", tmp_path / "out.npz", "--json", "-", "-q",
                 *extra)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["stream"] is streamed
    if extra:  # auto picks numba for in-memory blocks once this process has loaded it (no start-up cost then)
        assert document["core"] == ("numba" if "numba" in extra else "numpy")
    expect_oracle(load_npz(tmp_path / "out.npz"), arrays)
    result = cli("run", *flags, "--epsilon", "1e-3", "--format", "NCHW", "-o", tmp_path / "out2.npz", "--json", "-",
                 "-q", "--no-stream", *extra)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stream"] is False
    assert_same_outputs(load_npz(tmp_path / "out2.npz"), load_npz(tmp_path / "out.npz"), exact=not streamed)


@pytest.mark.parametrize("data_format, shape, one_channel_blocks, streamed", [
    ("NCHW", (3, 4, 5, 6), False, True),  # one block holds every channel: src is read once
    ("NHWC", (3, 5, 6, 4), False, True),
    ("NHWC", (3, 5, 6, 4), True, False),  # 4 one-channel blocks of 4-byte runs would each read the whole file
    ("NCHW", (3, 4, 5, 6), True, False),  # 30-float planes are short runs too
    ("NCHW", (1, 2, 128, 128), True, True),  # 64 KiB planes: each block reads its own bytes only
], ids=["NCHW-one-block", "NHWC-one-block", "NHWC-short-runs", "NCHW-small-planes", "NCHW-long-runs"])
def test_auto_stream_skips_blocks_that_reread_the_file(cli, tmp_path, rng, monkeypatch, data_format, shape,
                                                       one_channel_blocks, streamed):
    """Large .npy inputs stream by themselves, unless every block would read src's whole file (short runs); a
    share of available memory still makes them stream, whatever the runs."""
    from bnbwd_cli.app import streaming

    canonical = "NCX" if data_format == "NCHW" else "NXC"
    arrays = make_inputs(rng, shape, canonical)
    flags = save_npy_flags(tmp_path, arrays)
    monkeypatch.setattr(streaming, "STREAM_MIN_BYTES", 1)
    if one_channel_blocks:
        channels = shape[1] if canonical == "NCX" else shape[-1]
        monkeypatch.setattr(streaming, "STREAM_BLOCK_BYTES", arrays["src"].nbytes // channels * streaming.BYTES_PER_ELEMENT_FACTOR)
    common = ("--epsilon", "1e-3", "--format", data_format, "-q", "--json", "-")
    result = cli("run", *flags, *common, "--out-dir", tmp_path / "auto")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stream"] is streamed
    expect_oracle(read_dir(tmp_path / "auto"), arrays, data_format=canonical)
    monkeypatch.setattr(streaming, "available_memory", lambda: 64)  # loading would risk running out of memory
    result = cli("run", *flags, *common, "--out-dir", tmp_path / "tight")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stream"] is True
    assert all(np.array_equal(a, b) for a, b in zip(read_dir(tmp_path / "tight").values(), read_dir(tmp_path / "auto").values()))


def read_dir(directory: Path) -> dict[str, np.ndarray]:
    return {path.stem: np.load(path) for path in sorted(directory.glob("*.npy"))}


def assert_same_outputs(first: dict, second: dict, exact: bool) -> None:
    """exact: the same bits; else within the dtype's oracle bound (streamed runs tile by rows, so their float64
    sums may differ from in-memory ones in the last place)."""
    assert first.keys() == second.keys()
    for name in first:
        if exact:
            np.testing.assert_array_equal(first[name], second[name], err_msg=name)
        else:
            assert normalised_error(first[name], second[name].astype(np.float64)) <= BOUNDS[first[name].dtype.name], name


def test_small_npy_inputs_and_stdout_output_stay_in_memory(cli, tmp_path, rng, monkeypatch):
    from bnbwd_cli.app import streaming

    arrays = make_inputs(rng, (3, 4, 5, 6), "NCX")
    flags = save_npy_flags(tmp_path, arrays)
    common = ("--epsilon", "1e-3", "--format", "NCHW", "-q")
    result = cli("run", *flags, *common, "-o", tmp_path / "out.npz", "--json", tmp_path / "facts.json")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "facts.json").read_text())["stream"] is False
    monkeypatch.setattr(streaming, "STREAM_MIN_BYTES", 1)  # large, but -o - cannot take a memmapped output
    result = cli("run", *flags, *common, "-o", "-", "--json", tmp_path / "facts.json")
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "facts.json").read_text())["stream"] is False
    expect_oracle(dict(np.load(io.BytesIO(result.stdout_bytes))), arrays)


@pytest.mark.numba
def test_core_numba_streams_inputs_too_large_to_load(cli, tmp_path, rng, monkeypatch):
    # Over a quarter of available memory the inputs stream by blocks of channels, which are in memory: numba runs them.
    pytest.importorskip("numba")
    from bnbwd_cli.app import streaming

    monkeypatch.setattr(streaming, "available_memory", lambda: 64)
    arrays = make_inputs(rng, (3, 4, 5, 6), "NCX")
    flags = save_npy_flags(tmp_path, arrays)
    result = cli("run", *flags, "--epsilon", "1e-3", "--format", "NCHW", "-o", tmp_path / "out.npz", "--core", "numba",
                 "--json", tmp_path / "facts.json")
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "facts.json").read_text())["stream"] is True
    expect_oracle(dict(np.load(tmp_path / "out.npz")), arrays)
