"""diff_src's bias regression runs on a second thread beside the channel facts and the judging pass
(judge/diff_src.py, Judging.threads), or, with one thread, inside the judging pass on the pieces it has upcast: every
number of the comparison is the same either way, an error raised on that thread reaches the caller, and leaving
early stops it."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest

from bnbwd_cli import core
from bnbwd_cli.judge import diff_src, sets
from bnbwd_cli.judge.tolerance import Judging
from tests.test_judge_passes import small_op


def _outputs(data_format: str, seed: int):
    rng = np.random.default_rng(seed)
    inputs, shape = small_op(rng, data_format)
    result = core.backward(inputs, core.Settings())
    reference = {name: getattr(result, name) for name in ("diff_src", "diff_gamma", "diff_beta")}
    bits = reference["diff_src"].view(np.int32) + rng.integers(-30, 31, shape).astype(np.int32)
    actual = dict(reference, diff_src=(bits.view(np.float32) * np.float32(1 + 2e-6)).astype(np.float32))
    actual["diff_src"].reshape(-1)[::97] = np.nan
    return inputs, actual, reference


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("up_front", [False, True])
def test_threaded_judging_gives_the_single_threaded_numbers(data_format: str, up_front: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(diff_src, "BLOCK", 300)  # several blocks, and pieces within them
    monkeypatch.setattr(diff_src, "PIECE", 70)
    inputs, actual, reference = _outputs(data_format, 31)
    results = [sets.compare_sets(actual, reference, Judging(top=5, threads=threads, details_up_front=up_front),
                                 inputs=inputs) for threads in (1, 2)]
    one, two = ([(o.name, o.status, repr(o.comparison), repr(o.comparison.details)) for o in r.outputs] for r in results)
    assert one == two
    judged = results[0].outputs[0].comparison
    assert judged.bias is not None and judged.mismatches > 0


def test_an_error_on_the_regression_thread_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs, actual, reference = _outputs("NCX", 32)
    where = []

    def failing(*args, stop):
        where.append(threading.current_thread() is not threading.main_thread())
        raise MemoryError("no room for the regression's sums")

    monkeypatch.setattr(diff_src, "_regression_pass", failing)
    with pytest.raises(MemoryError, match="regression"):
        sets.compare_sets(actual, reference, Judging(threads=2), inputs=inputs)
    assert where == [True]


def test_leaving_early_stops_the_regression_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """An error in the facts' pass (or Ctrl-C there) sets the regression's stop flag and waits for its thread: no
    thread is left running, and the regression returns at its next block."""
    monkeypatch.setenv("BNBWD_CORE", "numpy")  # (the compiled judging runs no thread)
    monkeypatch.setattr(diff_src, "BLOCK", 100)
    inputs, actual, reference = _outputs("NCX", 33)
    started, finished = threading.Event(), []
    regression_pass = diff_src._regression_pass

    def slow(*args, stop):
        started.set()
        stop.wait(5)  # (released by the stop flag, not by the timeout)
        finished.append(regression_pass(*args, stop=stop))

    def interrupted(*args, **kwargs):
        started.wait(5)
        raise KeyboardInterrupt

    monkeypatch.setattr(diff_src, "_regression_pass", slow)
    monkeypatch.setattr(sets, "channel_facts", interrupted)
    before = threading.active_count()
    with pytest.raises(KeyboardInterrupt):
        sets.compare_sets(actual, reference, replace(Judging(), threads=2), inputs=inputs)
    assert finished == [None] and threading.active_count() == before


@pytest.mark.parametrize("judging_threads, beside", [(1, False), (2, True), (None, "machine")])
def test_judge_kernel_keeps_a_judgings_threads(judging_threads, beside, monkeypatch: pytest.MonkeyPatch) -> None:
    """judge_kernel (run --reference, verify --inputs, check and the API): the Judging's threads (check's workers
    set 1); with one thread the judging pass regresses its own pieces (no pass of the regression's own). None, the
    default of Judging as of core.Settings (one sentinel), is the machine's usable cores."""
    from bnbwd_cli.app import judge as app_judge
    from bnbwd_cli.app.judge import judge_kernel

    assert Judging().threads is None
    if beside == "machine":
        monkeypatch.setattr(app_judge, "usable_cores", lambda: 2)
        beside = True

    inputs, actual, _ = _outputs("NCX", 34)
    where = []
    regression_pass = diff_src._regression_pass

    def recording(*args, stop):
        where.append(threading.current_thread() is not threading.main_thread())
        return regression_pass(*args, stop=stop)

    monkeypatch.setattr(diff_src, "_regression_pass", recording)
    result = judge_kernel(inputs, actual, Judging(threads=judging_threads), required=("diff_src",))
    assert where == ([True] if beside else [])
    assert result.outputs[0].comparison.bias is not None


@pytest.mark.parametrize("change", ["none", "scaled"])
def test_run_reference_reports_the_same_with_one_thread_and_two(cli, tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                                change: str) -> None:
    """Through the real CLI: `run --reference --threads 1` (the judging pass regresses its own pieces) and
    `--threads 2` (the regression on a second thread) write the same --json document, byte for byte, and exit alike;
    --threads 2 did start the regression's thread."""
    monkeypatch.setattr(diff_src, "BLOCK", 300)
    inputs, actual, reference = _outputs("NCX", 35)
    if change == "none":
        actual = reference
    names = ("src", "diff_dst", "mean", "variance")
    np.savez(tmp_path / "in.npz", **{name: getattr(inputs, name) for name in names})
    np.savez(tmp_path / "kernel.npz", **actual)
    started = []
    for name in ("_regression_pass", "_unmoved_pass"):  # (an unmoved output's regression: the second)
        def recording(*args, stop=None, _name=name, _function=getattr(diff_src, name)):
            started.append((_name, stop is not None))  # (a thread's pass is given its stop event)
            return _function(*args, stop=stop)

        monkeypatch.setattr(diff_src, name, recording)
    results = [cli("run", tmp_path / "in.npz", "--epsilon", "1e-5", "--format", "NCX", "-q", "--threads", threads,
                   "--reference", tmp_path / "kernel.npz", "--json", "-") for threads in ("1", "2")]
    assert results[0].exit_code == results[1].exit_code == (0 if change == "none" else 1), results[0].stderr
    assert results[0].stdout == results[1].stdout
    if change == "none":  # one thread: a pass of its own after the judging pass; two: on the second thread
        assert started == [("_unmoved_pass", False), ("_unmoved_pass", True)]
    else:
        assert started == [("_regression_pass", True)]
