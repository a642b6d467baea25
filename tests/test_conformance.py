"""bnbwd agrees with PyTorch and TensorFlow on the committed fixtures.

Every case in fixtures/conformance/manifest.json (written by
tools/make_fixtures.py, which needs torch/tensorflow; these tests do not) is
run through the real CLI, `bnbwd run BUNDLE <spec profile and flags>`, and its
outputs are compared with the framework's stored outputs two ways:

- the normalised error max|bnbwd - framework| / max|framework| (float64 after
  upcasting) must stay within the manifest's per-dtype bound;
- bnbwd's own element-wise comparison (judge.compare.compare_arrays with its default
  tolerances for the output dtype, and `bnbwd verify` on the files) must pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

from bnbwd_cli.judge import compare
from bnbwd_cli.judge.tolerance import DEFAULT_TOLERANCES, comparison_dtype
from bnbwd_cli.cli import main
from bnbwd_cli.dtypes import to_float64 as _as_float64
from tests.conftest import load_npz
from tests.oracle import normalised_error
from tools import make_fixtures

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "conformance"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
CASES = MANIFEST["cases"]
OUTPUTS = ("diff_src", "diff_gamma", "diff_beta")
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPE_NAMES = {"float64": np.dtype(np.float64), "float32": np.dtype(np.float32),
               "float16": np.dtype(np.float16), "bfloat16": BF16}


def _as_dtype(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if a.dtype.kind == "V" and a.dtype.itemsize == 2 and dtype == BF16:
        return a.view(BF16)
    return a


def _expected_dtypes(entry: dict) -> dict[str, np.dtype]:
    t1, t2 = DTYPE_NAMES[entry["dtype"]], DTYPE_NAMES[entry["stats_dtype"]]
    return {"diff_src": t1, "diff_gamma": t2, "diff_beta": t2}


def _run(bundle: Path, args: list[str], out: Path) -> dict[str, np.ndarray]:
    result = CliRunner().invoke(main, ["run", str(bundle), *args, "-o", str(out)])
    assert result.exit_code == 0, f"bnbwd run exited {result.exit_code}: {result.output}"
    return load_npz(out)


@pytest.mark.parametrize("entry", CASES, ids=[c["name"] for c in CASES])
def test_bnbwd_run_matches_framework(entry: dict, tmp_path: Path) -> None:
    got = _run(FIXTURES / entry["bundle"], entry["bnbwd_args"], tmp_path / "out.npz")
    ref = load_npz(FIXTURES / entry["expected"])
    dtypes = _expected_dtypes(entry)
    assert set(OUTPUTS) <= set(got), f"outputs: {sorted(got)}"
    for key in OUTPUTS:
        a, r = _as_dtype(got[key], dtypes[key]), _as_dtype(ref[key], dtypes[key])
        assert a.dtype == dtypes[key], f"{key}: dtype {a.dtype}, framework gives {dtypes[key]}"
        assert a.shape == r.shape, f"{key}: shape {a.shape}, framework gives {r.shape}"
        err = normalised_error(a, _as_float64(r))
        bound = entry["tolerance"][key]
        assert err <= bound, f"{key}: normalised difference {err:.3g} > {bound:g} ({entry['dtype']} case)"
        result = compare.compare_arrays(a, r, DEFAULT_TOLERANCES[comparison_dtype(a.dtype, r.dtype)])
        assert result.passed, (
            f"{key}: {result.mismatches}/{result.elements} elements outside bnbwd's default "
            f"{result.dtype} tolerance {result.tolerance}; max abs {result.max_abs}, rel L2 {result.rel_l2:.3g}")
    # The same comparison as a user would run it: the verify command, default tolerances.
    verify = CliRunner().invoke(main, ["verify", str(tmp_path / "out.npz"), str(FIXTURES / entry["expected"]),
                                       "--json", "-"])
    assert verify.exit_code == 0, verify.output


@pytest.mark.parametrize("entry", CASES, ids=[c["name"] for c in CASES])
def test_fixture_files_match_manifest(entry: dict) -> None:
    """The committed arrays are the ones the manifest describes (no hand edits, no LFS pointers)."""
    assert make_fixtures.entry_problems(entry, FIXTURES) == []


def test_manifest_provenance_and_coverage() -> None:
    for e in CASES:
        for field in ("framework", "framework_version", "op", "args", "seed", "bnbwd_args", "tolerance",
                      "framework_vs_oracle"):
            assert e.get(field) not in (None, ""), f"{e['name']}: no {field}"
    torch = [e for e in CASES if e["framework"] == "pytorch"]
    tf = [e for e in CASES if e["framework"] == "tensorflow"]
    # PyTorch: NCX ranks 2-5, channels-last 4D/5D, f64, bf16 with f32 stats, gamma absent, train and eval.
    assert {len(e["shape"]) for e in torch if e["layout"] == "NCX"} >= {2, 3, 4, 5}
    assert {len(e["shape"]) for e in torch if e["layout"] == "NXC"} >= {4, 5}
    assert any(e["dtype"] == "float64" for e in torch)
    assert any(e["dtype"] == "bfloat16" and e["stats_dtype"] == "float32" for e in torch)
    assert any(not e["gamma"] for e in torch)
    assert {e["train"] for e in torch} == {True, False}
    assert {e["variance_convention"] for e in torch} == {"variance", "invstd"}
    # TensorFlow: NHWC and NCHW, f32/f16/bf16 x with f32 scale, is_training both ways, non-default epsilon.
    assert {(e["layout"], e["dtype"]) for e in tf} >= {(lay, dt) for lay in ("NXC", "NCX")
                                                        for dt in ("float32", "float16", "bfloat16")}
    assert all(e["stats_dtype"] == "float32" for e in tf)
    assert {e["train"] for e in tf} == {True, False}
    assert any(e["epsilon"] != 1e-4 for e in tf)


def test_fixtures_stay_small() -> None:
    total = sum(p.stat().st_size for p in FIXTURES.iterdir())
    assert total < 3_000_000, f"fixtures/conformance is {total / 1e6:.2f} MB"
