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
    assert "where: h=4..5 only (2 of 6 rows); all n, c, w; all larger in magnitude than the reference" in full.stdout
    assert "failing share: rows c, columns 60 blocks of each channel's 240 positions (n, h, w flattened in storage order)" in full.stdout
    assert "█ >= 75% of the cell's elements fail" in full.stdout
    brief = cli("run", bundle, "-q", "--reference", kernel, "--brief")
    assert ("  where: h=4..5 only (2 of 6 rows); all n, c, w; all larger in magnitude than the reference"
            in brief.stdout.splitlines())
    document = json.loads(cli("run", bundle, "-q", "--reference", kernel, "--json", "-").stdout)
    diff_src = next(o for o in document["outputs"] if o["name"] == "diff_src")["comparison"]
    assert diff_src["where"]["kind"] == "axes" and diff_src["where"]["axes"] == {"h": [[4, 5]]}
    assert sum(map(sum, diff_src["heat_map"]["failing"])) == diff_src["mismatches"]
    correct = cli("run", bundle, "-q", "--reference", _kernel(directory, "correct", grads, lambda o: None), "--json", "-")
    assert correct.exit_code == 0
    assert all(o["comparison"]["where"] is None and o["comparison"]["heat_map"] is None
               for o in json.loads(correct.stdout)["outputs"])


def test_the_errors_sign_is_said_when_one_sided_and_not_when_mixed(cli, problem):
    """Rows h>=4 lowered by 1% of their size (every error negative) read "all below the reference" in every form,
    with the counts in JSON; the same rows off by noise of either sign add no words but the counts."""
    directory, bundle, _, grads = problem

    def lowered(outputs):
        d = outputs["diff_src"]
        d[:, :, 4:] -= np.float32(0.01) * np.abs(d[:, :, 4:]) + np.float32(1e-3)

    kernel = _kernel(directory, "lowered", grads, lowered)
    words = "where: h=4..5 only (2 of 6 rows); all n, c, w; all below the reference"
    assert words in cli("run", bundle, "-q", "--reference", kernel).stdout
    assert f"  {words}" in cli("run", bundle, "-q", "--reference", kernel, "--brief").stdout.splitlines()
    document = json.loads(cli("run", bundle, "-q", "--reference", kernel, "--json", "-").stdout)
    where = next(o for o in document["outputs"] if o["name"] == "diff_src")["comparison"]["where"]
    assert where["above"] == 0 and where["below"] == where["failing"] > 0
    def noisy(outputs):
        d = outputs["diff_src"]
        d[:, :, 4:] += np.float32(0.05) * np.random.default_rng(3).choice([-1, 1], d[:, :, 4:].shape).astype(np.float32)

    mixed = json.loads(cli("run", bundle, "-q", "--reference", _kernel(directory, "noisy", grads, noisy), "--json",
                           "-").stdout)
    where = next(o for o in mixed["outputs"] if o["name"] == "diff_src")["comparison"]["where"]
    assert where["text"] == "h=4..5 only (2 of 6 rows); all n, c, w"
    assert 0 < where["above"] < where["failing"] and where["above"] + where["below"] == where["failing"]
    assert 0 < where["larger"] < where["failing"] and where["larger"] + where["smaller"] == where["failing"]


def test_a_nan_leads_run_reference_verify_and_check(cli, problem, tmp_path):
    directory, bundle, inputs, grads = problem
    kernel = _kernel(directory, "nan", grads, _nan)
    lead = ("241 NaN where the reference is finite (first at n=0 c=5 h=0 w=0; n=0 c=5 h=0 w=1; n=0 c=5 h=0 w=2; ...); "
            "c=5 all NaN; where: c=5 only (1 of 8 channels); all n, h, w (1 of the 241 elsewhere)")
    full = cli("run", bundle, "-q", "--reference", kernel)
    assert full.exit_code == 1 and f"NaN/Inf: {lead}" in full.stdout
    assert "max-units" not in full.stdout, [li for li in full.stdout.splitlines() if "max-units" in li]
    assert "no K passes the NaN/Inf" in full.stdout
    brief = cli("run", bundle, "-q", "--reference", kernel, "--brief")
    assert f"diff_src: FAIL {lead}; on the finite elements: max " in brief.stdout
    # verify without inputs: the fixed rule, the same NaN line
    reference = _kernel(directory, "reference", grads, lambda o: None)
    verify = cli("verify", kernel, reference, "--format", "NCHW", "--brief")
    assert verify.exit_code == 1 and f"diff_src: FAIL {lead}; " in verify.stdout
    # check: the case's line
    case = save_bundle(tmp_path / "case.npz", {**inputs, **dict(np.load(kernel))}, epsilon=1e-3, data_format="NCHW")
    checked = cli("check", case)
    assert checked.exit_code == 1 and f"diff_src FAIL {lead}" in checked.stdout
    line = next(li for li in checked.stdout.splitlines() if li.startswith("FAIL"))
    assert f"case.npz: diff_src FAIL {lead}" in line and line.index("NaN where") < line.index("hint:"), line  # NaN first


PATTERNS = ("rows", "channels", "sample", "tile", "stride", "tail")


def _plant(pattern: str, d: np.ndarray, layout: str, rng) -> str:
    """Spoil one pattern of diff_src (every element in it off by 1.0) and return the words `where` must say."""
    n, c, h, w = d.shape if layout == "NCHW" else (d.shape[0], d.shape[3], d.shape[1], d.shape[2])
    axes = {"n": 0, "c": 1 if layout == "NCHW" else 3, "h": 2 if layout == "NCHW" else 1, "w": 3 if layout == "NCHW" else 2}
    others = ", ".join(a for a in (("n", "c", "h", "w") if layout == "NCHW" else ("n", "h", "w", "c")))

    def spoil(**ranges):
        index = [slice(None)] * 4
        for axis, (lo, hi) in ranges.items():
            index[axes[axis]] = slice(lo, hi + 1)
        d[tuple(index)] += 1.0

    if pattern in ("rows", "channels", "sample"):
        axis, size, unit = {"rows": ("h", h, "rows"), "channels": ("c", c, "channels"), "sample": ("n", n, "samples")}[pattern]
        lo = int(rng.integers(1, size - 1))
        hi = int(rng.integers(lo, size - 1))
        spoil(**{axis: (lo, hi)})
        rest = ", ".join(a for a in others.split(", ") if a != axis)
        return f"{axis}={lo if lo == hi else f'{lo}..{hi}'} only ({hi - lo + 1} of {size} {unit}); all {rest}"
    if pattern == "tile":
        h0, w0 = int(rng.integers(1, h - 3)), int(rng.integers(1, w - 3))
        spoil(h=(h0, h0 + 2), w=(w0, w0 + 2))
        return f"h={h0}..{h0 + 2}, w={w0}..{w0 + 2}; all n, c"
    flat = d.reshape(-1)
    if pattern == "stride":
        offset = int(rng.integers(0, 32))
        flat[offset::32] += 1.0
        return f"every 32nd element in storage order, offset {offset}"
    count = int(rng.integers(20, 200))
    flat[-count:] += 1.0
    return f"the last {count} elements of the buffer: "


@pytest.mark.parametrize("dtype", [np.float32, "bf16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_planted_patterns_are_placed_through_the_api(dtype, layout, pattern):
    from bnbwd_cli.dtypes import dtype_from_name

    kind = dtype_from_name(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    rng = np.random.default_rng(PATTERNS.index(pattern) * 7 + len(layout))
    shape = (5, 9, 7, 11) if layout == "NCHW" else (5, 7, 11, 9)  # no trailing block a multiple of 32
    inputs = dict(make_inputs(rng, shape, "NCX" if layout == "NCHW" else "NXC", dtype=kind), epsilon=1e-3,
                  data_format=layout)
    grads = {k: np.array(v) for k, v in bnbwd_cli.backward(**inputs).items()}
    d = grads["diff_src"].astype(np.float64)
    words = _plant(pattern, d, layout, rng)
    report = bnbwd_cli.check(dict(grads, diff_src=d.astype(kind)), **inputs)
    c = next(o for o in report.result.outputs if o.name == "diff_src").comparison
    assert c.details.where is not None and c.details.where.text.startswith(words), (c.details.where, words)
    assert f"  where: {words}" in report.summary
    document = json.loads(report.to_json())
    where = next(o for o in document["outputs"] if o["name"] == "diff_src")["comparison"]["where"]
    assert where["text"].startswith(words) and where["covered"] == where["failing"] == c.finite_mismatches
    # every spoiled element is 1.0 too large: the errors' sign is said and counted
    assert where["text"].endswith("; all above the reference") and where["above"] == where["failing"]
    assert where["below"] == 0


def test_save_error_writes_every_element_s_judgement_in_the_output_s_shape(cli, problem, tmp_path):
    directory, bundle, _, grads = problem
    kernel = _kernel(directory, "nan_rows", grads, lambda o: (_rows(o), _nan(o)))
    target = tmp_path / "errors.npz"
    result = cli("run", bundle, "-q", "--reference", kernel, "--save-error", target, "--brief")
    assert result.exit_code == 1, result.output
    report = bnbwd_cli.check(dict(np.load(kernel)), **problem[2], epsilon=1e-3, data_format="NCHW")
    with np.load(target) as saved:
        assert sorted(saved) == sorted(f"{o}.{k}" for o in ("diff_src", "diff_gamma", "diff_beta")
                                       for k in ("failing", "nonfinite", "ratio", "units"))
        for output in report.result.outputs:
            c = output.comparison
            failing, nonfinite = saved[f"{output.name}.failing"], saved[f"{output.name}.nonfinite"]
            assert failing.shape == nonfinite.shape == c.shape and failing.sum() == c.mismatches
            assert nonfinite.sum() == c.nonfinite.mismatches
            units, ratio = saved[f"{output.name}.units"], saved[f"{output.name}.ratio"]
            assert units.dtype == np.float32 and np.isnan(units[nonfinite]).all()
            assert np.array_equal(ratio[~nonfinite] > 1, failing[~nonfinite])
            np.testing.assert_array_equal(report.errors(output.name)["failing"], failing)  # the API's own
            if c.max_units is not None and c.max_units.index is not None:
                assert units[c.max_units.index] == np.float32(c.max_units.value)
    fixed = cli("verify", kernel, _kernel(directory, "reference", grads, lambda o: None), "--save-error",
                tmp_path / "fixed.npz", "--brief")
    assert fixed.exit_code == 1
    with np.load(tmp_path / "fixed.npz") as saved:
        assert "diff_src.units" not in saved and saved["diff_src.failing"].shape == grads["diff_src"].shape


@pytest.mark.parametrize("args, code, message", [
    (["--save-error", "-"], 2, r"--save-error -: the arrays go to a file; give --save-error FILE.npz"),
    (["--save-error", "{bundle}"], 3, r"--save-error .*inputs\.npz: is also an input"),
    (["--save-error", "{tmp}/missing/e.npz"], 3, r"--save-error .*/missing/e\.npz: directory .*missing does not exist"),
    (["--save-error", "{tmp}/o.npz", "-o", "{tmp}/o.npz"], 2, r"--save-error .*/o\.npz is also another output"),
])
def test_save_error_bad_destinations(cli, problem, tmp_path, args, code, message):
    from tests.conftest import assert_one_error

    directory, bundle, _, grads = problem
    kernel = _kernel(directory, "rows", grads, _rows)
    args = [a.format(bundle=bundle, tmp=tmp_path) for a in args]
    assert_one_error(cli("run", bundle, "-q", "--reference", kernel, *args), message, code)
    assert_one_error(cli("run", bundle, "-q", "--save-error", tmp_path / "e.npz"), r"--save-error saves a judgement: "
                     r"give --reference KERNEL_OUT", 2)
    assert cli("check", bundle, "--save-error", tmp_path / "e.npz").exit_code == 2  # check judges many: no such option


def test_the_precise_hint_leads_and_a_shared_hint_is_said_once(cli, problem, tmp_path):
    from bnbwd_cli.dtypes import dtype_from_name

    directory, bundle, inputs, grads = problem
    bf16 = dtype_from_name("bf16")
    narrow = {k: v.astype(bf16).astype(np.float32) for k, v in grads.items()}  # computed in bf16, stored as f32
    case = save_bundle(tmp_path / "narrow.npz", {**inputs, **narrow}, epsilon=1e-3, data_format="NCHW")
    line = cli("check", case).stdout.splitlines()[0]
    assert line.startswith(f"FAIL  {case}: hint: every element of actual is exactly a bfloat16 value"), line
    report = bnbwd_cli.check(narrow, **inputs, epsilon=1e-3, data_format="NCHW")
    failing = [o for o in report.result.outputs if o.status == "mismatch"]
    assert len(failing) >= 2 and all(o.comparison.hints[0].startswith("every element of actual") for o in failing)
    # the same note on every output: said under the first, "as for" under the others
    from bnbwd_cli.render.brief import phrase

    summary = report.summary
    note = phrase(failing[0].comparison.hints[0], "api")
    assert all(o.comparison.hints[0] == failing[0].comparison.hints[0] for o in failing)
    assert summary.count(note) == 1 and summary.count(f"hint: as for {failing[0].name}") >= len(failing) - 1


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("pattern", ["rows", "tile", "stride"])
def test_the_issue_s_patterns_off_by_a_few_units_are_placed(layout, pattern):
    """Rows h >= 24, a 16x16 tile, every 32nd element, each scaled by 1 + 4e-6 in float32 (~20-30 units: about half
    of the region's elements fail): the region is named (with how many of its elements fail when fewer than half
    do: judge/where._by_elevated), and the errors said
    larger in magnitude (a scale moves values away from zero, above and below the reference)."""
    fmt = "NCX" if layout == "NCHW" else "NXC"
    shape = (4, 16, 28, 28) if fmt == "NCX" else (4, 28, 28, 16)
    inputs = dict(make_inputs(np.random.default_rng(5), shape, fmt), epsilon=1e-5, data_format=layout)
    grads = {k: np.array(v) for k, v in bnbwd_cli.backward(**inputs).items()}
    d = grads["diff_src"].astype(np.float64)
    spatial = (slice(None), slice(None)) if fmt == "NCX" else (slice(None),)
    if pattern == "rows":
        d[(*spatial, slice(24, None))] *= 1 + 4e-6
        words = f"h=24..27 only (4 of 28 rows); all {'n, c, w' if fmt == 'NCX' else 'n, w, c'}"
    elif pattern == "tile":
        d[(*spatial, slice(16, 32), slice(16, 32))] *= 1 + 4e-6
        words = "h=16..27, w=16..27; all n, c"
    else:
        d.reshape(-1)[31::32] *= 1 + 4e-6
        words = "every 32nd element in storage order, offset 31"
    report = bnbwd_cli.check(dict(grads, diff_src=d.astype(np.float32)), **inputs)
    c = next(o for o in report.result.outputs if o.name == "diff_src").comparison
    where = c.details.where
    assert report.status == "mismatch" and where.text.startswith(words), where.text
    assert where.text.endswith("; all larger in magnitude than the reference") and where.larger == where.failing
    assert where.covered >= 0.9 * c.finite_mismatches
    assert "are off by more than 0.5 of their allowance)" in where.text  # (here fewer than half of them fail)
