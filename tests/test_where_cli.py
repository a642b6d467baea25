"""NaN first, `where:` and the map through the real CLI: run --reference (full report, --brief, --json), verify
without inputs (the fixed rule) and check's line; a correct kernel gets no `where`."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bnbwd_cli
from tests.conftest import make_inputs, save_bundle


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    """A bundle of inputs (NCHW f32) and bnbwd's outputs for it."""
    rng = np.random.default_rng(34)
    directory = tmp_path_factory.mktemp("where")
    inputs = make_inputs(rng, (4, 8, 6, 10))
    bundle = save_bundle(directory / "inputs.npz", inputs, epsilon=1e-3, data_format="NCHW")
    grads = {k: np.array(v) for k, v in bnbwd_cli.backward(**inputs, epsilon=1e-3, data_format="NCHW").items()}
    return directory, bundle, inputs, grads


def _kernel(directory, name, grads, change) -> str:
    outputs = {k: v.copy() for k, v in grads.items()}
    change(outputs)
    path = directory / f"{name}.npz"
    np.savez(path, **outputs)
    return str(path)


def _rows(outputs):
    outputs["diff_src"][:, :, 4:] *= np.float32(1.01)


def _nan(outputs):
    outputs["diff_src"][1, 2, 3, 4] = np.nan
    outputs["diff_src"][:, 5] = np.nan


def test_run_reference_places_the_failures_in_every_form(cli, problem):
    directory, bundle, _, grads = problem
    kernel = _kernel(directory, "rows", grads, _rows)
    full = cli("run", bundle, "-q", "--reference", kernel)
    assert full.exit_code == 1, full.output
    assert "where: h=4..5 only (2 of 6 rows); all n, c, w" in full.stdout
    assert "failing share: rows c, columns 60 blocks of each channel's 240 positions (n, h, w flattened in storage order)" in full.stdout
    assert "█ >= 75% of the cell's elements fail" in full.stdout
    brief = cli("run", bundle, "-q", "--reference", kernel, "--brief")
    assert "  where: h=4..5 only (2 of 6 rows); all n, c, w" in brief.stdout.splitlines()
    document = json.loads(cli("run", bundle, "-q", "--reference", kernel, "--json", "-").stdout)
    diff_src = next(o for o in document["outputs"] if o["name"] == "diff_src")["comparison"]
    assert diff_src["where"]["kind"] == "axes" and diff_src["where"]["axes"] == {"h": [[4, 5]]}
    assert sum(map(sum, diff_src["heat_map"]["failing"])) == diff_src["mismatches"]
    correct = cli("run", bundle, "-q", "--reference", _kernel(directory, "correct", grads, lambda o: None), "--json", "-")
    assert correct.exit_code == 0
    assert all(o["comparison"]["where"] is None and o["comparison"]["heat_map"] is None
               for o in json.loads(correct.stdout)["outputs"])


def test_a_nan_leads_run_reference_verify_and_check(cli, problem, tmp_path):
    directory, bundle, inputs, grads = problem
    kernel = _kernel(directory, "nan", grads, _nan)
    lead = ("241 NaN where the reference is finite (first at n=0 c=5 h=0 w=0; n=0 c=5 h=0 w=1; n=0 c=5 h=0 w=2; ...); "
            "c=5 all NaN; where: c=5 only (1 of 8 channels); all n, h, w (1 of the 241 elsewhere)")
    full = cli("run", bundle, "-q", "--reference", kernel)
    assert full.exit_code == 1 and f"NaN/Inf: {lead}" in full.stdout
    assert "max-units" not in full.stdout and "no K passes the NaN/Inf" in full.stdout
    brief = cli("run", bundle, "-q", "--reference", kernel, "--brief")
    assert f"diff_src: FAIL {lead}; on the finite elements: max " in brief.stdout
    # verify without inputs: the fixed rule, the same NaN line
    reference = _kernel(directory, "reference", grads, lambda o: None)
    verify = cli("verify", kernel, reference, "--format", "NCHW", "--brief")
    assert verify.exit_code == 1 and f"diff_src: FAIL {lead}; " in verify.stdout
    # check: the case's line
    case = save_bundle(tmp_path / "case.npz", {**inputs, **dict(np.load(kernel))}, epsilon=1e-3, data_format="NCHW")
    checked = cli("check", case)
    assert checked.exit_code == 1 and f"diff_src FAIL {lead}; on the finite elements: " in checked.stdout
