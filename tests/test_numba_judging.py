"""The compiled judging (numba, optional: runtime.numba_judging) reports the NumPy path's numbers bit for bit: the
channel facts (judge/numba_facts.py) in every dtype and layout, odd shapes, tiny M, several blocks, NaN and Inf."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from bnbwd_cli.judge import model
from bnbwd_cli.layout import view3
from bnbwd_cli.op import Op

pytestmark = pytest.mark.numba
numba_facts = pytest.importorskip("bnbwd_cli.judge.numba_facts", exc_type=ImportError)

DTYPES = (np.float32, ml_dtypes.bfloat16, np.float16, np.float64)
# (shape, layout): odd runs, M of 1 and 2, rows of one element (NXC), a run longer than einsum's 8-element step,
# and (last two) several blocks of model.CHUNK elements in each layout
SHAPES = (((2, 3, 5, 7), "NCX"), ((3, 4, 17), "NCX"), ((1, 2, 1), "NCX"), ((2, 1, 3), "NXC"), ((64, 9), "NXC"),
          ((5, 7, 2, 3), "NXC"), ((3, 3, 300, 11), "NCX"))
SEVERAL_BLOCKS = (((2, 4, 400, 400), "NCX"), ((45, 100, 100, 3), "NXC"))


def _op(rng: np.random.Generator, shape: tuple[int, ...], data_format: str, dtype, non_finite: bool = False) -> Op:
    channels = shape[1] if data_format == "NCX" else shape[-1]
    src = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    dy = (rng.standard_normal(shape) + 0.5).astype(dtype)
    if non_finite:
        dy.reshape(-1)[1], src.reshape(-1)[-1], dy.reshape(-1)[-2] = np.nan, np.inf, -np.inf
    mean = (rng.standard_normal(channels) * 0.1).astype(np.float32)
    variance = rng.uniform(0.5, 1.5, channels).astype(np.float32)
    return Op(src, dy, mean, variance, None, epsilon=1e-5, data_format=data_format)


def _facts(op: Op, core: str, monkeypatch: pytest.MonkeyPatch, advance=None) -> model.ChannelFacts:
    """model.channel_facts with the judging compiled ($BNBWD_CORE=numba: runtime.numba_judging) or not (numpy)."""
    monkeypatch.setenv("BNBWD_CORE", core)
    with np.errstate(all="ignore"):
        return model.channel_facts(op, advance)


def _same_bits(a: model.ChannelFacts, b: model.ChannelFacts) -> list[str]:
    """The facts' fields whose bits differ."""
    differ = []
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                differ.append(field.name)
        elif x != y:
            differ.append(field.name)
    return differ


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_compiled_channel_facts_are_the_numpy_facts_bit_for_bit(dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(31)
    for (shape, data_format), non_finite in zip(SHAPES * 2, [False] * len(SHAPES) + [True] * len(SHAPES)):
        op = _op(rng, shape, data_format, dtype, non_finite)
        dy3 = view3(op.diff_dst, data_format)
        with np.errstate(all="ignore"):  # (the hook's own call: it did not decline)
            assert numba_facts.facts_sums(op, list(model.blocks(dy3.shape)), model.channel_constants(op)[:2]) is not None
        compiled, plain = (_facts(op, core, monkeypatch) for core in ("numba", "numpy"))
        assert _same_bits(compiled, plain) == [], (shape, data_format, non_finite)


@pytest.mark.parametrize("shape,data_format", SEVERAL_BLOCKS)
def test_compiled_channel_facts_carry_the_sums_across_blocks(shape: tuple[int, ...], data_format: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    op = _op(np.random.default_rng(32), shape, data_format, np.float32)
    assert len(list(model.blocks(view3(op.diff_dst, data_format).shape))) >= 2
    ticks: list[int] = []
    compiled = _facts(op, "numba", monkeypatch, ticks.append)
    assert _same_bits(compiled, _facts(op, "numpy", monkeypatch)) == [] and sum(ticks) == op.src.size


def test_blocks_of_one_channel_are_left_to_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """One channel in a block: NumPy's einsum and plane.sum take other orders there, so the compiled sums decline
    and model.channel_facts forms them itself; elsewhere it takes the compiled ones when the judging runs
    compiled ($BNBWD_CORE=numba), never with $BNBWD_CORE=numpy."""
    rng = np.random.default_rng(33)
    calls = []
    compiled = numba_facts.facts_sums
    monkeypatch.setattr(numba_facts, "facts_sums", lambda *args: calls.append(compiled(*args)) or calls[-1])
    one, two = _op(rng, (4, 1, 30), "NCX", np.float32), _op(rng, (4, 2, 30), "NCX", np.float32)
    assert _facts(one, "numba", monkeypatch).diff_beta.shape == (1,) and calls == [None]
    _facts(two, "numba", monkeypatch)
    assert len(calls) == 2 and calls[-1] is not None
    _facts(two, "numpy", monkeypatch)
    assert len(calls) == 2


KERNELS = ("exact", "ulps", "scaled", "non-finite", "zeros", "failing")


def _kernel_output(reference: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """diff_src as a kernel wrote it: bnbwd's own, a few ULPs off in half the elements, scaled by 1 + 3e-6, with
    NaN, with zeros (some flushed subnormals among them: the FTZ rule), or failing (every third 1% off)."""
    a = reference.copy()
    flat = a.reshape(-1)
    if kind == "ulps":
        bits = flat.view(f"i{a.itemsize}")
        bits += (rng.integers(-3, 4, bits.size) * (rng.random(bits.size) < 0.5)).astype(bits.dtype)
    elif kind == "scaled":
        flat *= a.dtype.type(1 + 3e-6)
    elif kind == "non-finite":
        flat[::17] = np.nan
    elif kind == "zeros":
        flat[::5] = 0
    elif kind == "failing":
        flat[::3] *= a.dtype.type(1.01)
    return a


def _judged(op: Op, outputs: dict, reference: dict, core: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every number the judge reports on diff_src and the sums (their repr, the details too), one thread and two."""
    from bnbwd_cli.judge import sets
    from bnbwd_cli.judge.tolerance import Judging

    monkeypatch.setenv("BNBWD_CORE", core)
    rows = []
    for threads in (1, 2):
        with np.errstate(all="ignore"):
            result = sets.compare_sets(outputs, reference, Judging(threads=threads), inputs=op)
        rows.append(repr(result.outputs) + repr([output.comparison.details for output in result.outputs]))
    return rows


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape,data_format", [((2, 3, 5, 7), "NCX"), ((30, 20, 4), "NXC"), ((2, 1, 3), "NXC")])
def test_compiled_judging_pass_reports_the_numpy_numbers_bit_for_bit(dtype, shape, data_format: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """judge/numba_pass.py (the judging pass without details and the regression's sums in one loop) against the
    NumPy pass: every kernel kind, the details formed afterwards (a failing output) included. The kernel judges
    every block but the non-finite output's (left to NumPy) and float64's (its ULP grid: not compiled); an output
    equal to its reference takes the NumPy pass's cheaper shortcut (diff_src._unmoved_pass)."""
    from bnbwd_cli.app.judge import reference_outputs
    from bnbwd_cli.judge import numba_pass

    rng = np.random.default_rng(34)
    op = _op(rng, shape, data_format, dtype)
    names = ("diff_src", "diff_gamma", "diff_beta")
    reference = reference_outputs(op, names, threads=1)
    judged = []
    kernel = numba_pass.judge_block
    monkeypatch.setattr(numba_pass, "judge_block", lambda *args: judged.append(kernel(*args)) or judged[-1])
    for kind in KERNELS:
        outputs = {**reference, "diff_src": _kernel_output(reference["diff_src"], kind, rng)}
        judged.clear()
        compiled = _judged(op, outputs, reference, "numba", monkeypatch)
        unmoved = outputs["diff_src"].tobytes() == reference["diff_src"].tobytes()  # (scaled by 1 + 3e-6: bf16's too)
        assert judged == ([] if dtype == np.float64 or unmoved else [kind != "non-finite"] * 2), kind
        assert compiled == _judged(op, outputs, reference, "numpy", monkeypatch), kind


@pytest.mark.parametrize("shape,data_format", [((3, 4, 3000), "NCX"), ((200, 30, 5), "NXC")])
def test_compiled_judging_pass_over_many_pieces_and_einsum_parts(shape: tuple[int, ...], data_format: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of several einsum buffers (the relative L2's parts of 8192) and many pieces, some ending inside a
    channel's run (a piece of 1000 elements against runs of 3000; NXC: 33 rows of 30 channels a piece): the same
    numbers. A failing output leaves the compiled pass at its first failing block for the NumPy pass."""
    from bnbwd_cli.app.judge import reference_outputs
    from bnbwd_cli.judge import diff_src

    rng = np.random.default_rng(35)
    op = _op(rng, shape, data_format, np.float32)
    names = ("diff_src", "diff_gamma", "diff_beta")
    reference = reference_outputs(op, names, threads=1)
    monkeypatch.setattr(diff_src, "PIECE", 1000)
    passes = []
    compiled_pass = diff_src._compiled_pass
    monkeypatch.setattr(diff_src, "_compiled_pass", lambda *args: passes.append(compiled_pass(*args)) or passes[-1])
    for kind in ("ulps", "failing"):
        outputs = {**reference, "diff_src": _kernel_output(reference["diff_src"], kind, rng)}
        assert _judged(op, outputs, reference, "numba", monkeypatch) == _judged(op, outputs, reference, "numpy",
                                                                               monkeypatch)
    # ulps: compiled, with one thread and two; failing: handed to the NumPy pass (it gathers the details as it fails)
    assert [outcome is not None for outcome in passes] == [True, True, False, False]


def test_compiled_unmoved_sums_judge_as_the_numpy_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """An output equal to its reference: the compiled unmoved sums (judge/numba_unmoved.py, not NumPy's order, which
    fit() allows for) decide every channel's fit as NumPy's do (f32/bf16/f16, both layouts, coarse and constant
    diff_dst, M of 6), and a non-finite xhat leaves the fit undecided (then the exact sums decide): every reported
    number the same, with one thread and two."""
    from bnbwd_cli.judge import bias, numba_unmoved
    from tests.test_judge_pieces import _unmoved_problems

    added = []
    compiled_add = numba_unmoved.add
    monkeypatch.setattr(numba_unmoved, "add", lambda *args: added.append(compiled_add(*args)) or added[-1])
    fitted = 0
    problems = list(_unmoved_problems())
    infinite = problems[0][0]
    infinite.src.reshape(-1)[7] = np.inf  # xhat not finite there: undecided
    for op, reference in problems:
        outputs = {"diff_src": reference}
        compiled = _judged(op, outputs, outputs, "numba", monkeypatch)
        assert compiled == _judged(op, outputs, outputs, "numpy", monkeypatch)
        fitted += "scale=0.0" in compiled[0]
    assert added and all(outcome is True for outcome in added)
    undecided = bias.ChannelRegression(5, "f32", unmoved=True)
    views = tuple(view3(x, "NCX") for x in (problems[0][1], problems[0][1], infinite.diff_dst, infinite.src))
    assert numba_unmoved.add(undecided, views, model.channel_constants(infinite)[:2], 1 << 20) is True
    assert undecided.undecided and undecided.fit() is None
    assert fitted  # (some problems' channels are fitted: the decisions are exercised, not all refused)


def test_a_numpy_whose_einsum_sums_otherwise_keeps_the_numpy_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled sums reproduce this NumPy's einsum order (checked once a process: numba_facts.einsum_order_matches,
    True here); a NumPy built otherwise would sum in another order, and then neither the compiled facts nor the
    compiled judging pass runs: the NumPy passes give their own numbers."""
    from bnbwd_cli.app.judge import reference_outputs
    from bnbwd_cli.judge import diff_src

    assert numba_facts.einsum_order_matches()
    monkeypatch.setattr(numba_facts, "einsum_order_matches", lambda: False)
    monkeypatch.setattr("bnbwd_cli.judge.numba_pass.einsum_order_matches", lambda: False)
    op = _op(np.random.default_rng(37), (2, 3, 40), "NCX", np.float32)
    assert numba_facts.facts_sums(op, list(model.blocks((2, 3, 40))), model.channel_constants(op)[:2]) is None
    passes = []
    compiled_pass = diff_src._compiled_pass
    monkeypatch.setattr(diff_src, "_compiled_pass", lambda *args: passes.append(compiled_pass(*args)) or passes[-1])
    reference = reference_outputs(op, ("diff_src",), threads=1)
    outputs = {"diff_src": _kernel_output(reference["diff_src"], "ulps", np.random.default_rng(38))}
    assert _judged(op, outputs, reference, "numba", monkeypatch) == _judged(op, outputs, reference, "numpy", monkeypatch)
    assert passes == [None, None]
