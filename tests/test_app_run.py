"""app/run.py: one backward pass from files, through prepare (read and check) and compute (run and write); a
streamed run writes the in-memory run's bits, and the op's settings come from the request over the bundle."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest

from bnbwd_cli.app import run as app_run
from bnbwd_cli.app.inputs import OpSettings
from bnbwd_cli.files import write as files_write
from tests.conftest import make_inputs, save_bundle

OUTPUTS = ("diff_src", "diff_gamma", "diff_beta")


def _run(request: app_run.RunRequest) -> tuple[app_run.Prepared, app_run.Computed]:
    with contextlib.ExitStack() as stack, files_write.one_commit():
        prepared = app_run.prepare(request, stack)
        return prepared, app_run.compute(request, prepared)


@pytest.fixture
def sources(rng, tmp_path: Path) -> dict[str, str]:
    arrays = make_inputs(rng, (2, 5, 6, 7), "NCX")
    paths = {}
    for name, array in arrays.items():
        paths[name] = str(tmp_path / f"{name}.npy")
        np.save(paths[name], array)
    return paths


def test_a_streamed_run_writes_the_in_memory_runs_bits(sources, tmp_path):
    written = {}
    for stream in (False, True):
        out = tmp_path / f"out-{stream}"
        out.mkdir()  # the CLI vets and makes it (files/write.py); app/ writes into it
        request = app_run.RunRequest(None, sources, OpSettings(epsilon=1e-5, data_format="NCHW"), OUTPUTS,
                                     app_run.Destination(out_dir=out), app_run.Compute(stream=stream, threads=1))
        prepared, computed = _run(request)
        assert prepared.stream is stream and set(computed.stats) == set(OUTPUTS)
        written[stream] = {name: np.load(out / f"{name}.npy") for name in OUTPUTS}
    for name in OUTPUTS:
        assert written[True][name].tobytes() == written[False][name].tobytes(), name


def test_the_requests_settings_win_over_the_bundles_entries_and_unused_keys_are_noted(rng, tmp_path):
    arrays = make_inputs(rng, (2, 3, 4, 4), "NCX")
    bundle = save_bundle(tmp_path / "b.npz", {**arrays, "step": np.int64(1)}, epsilon=0.5, data_format="NCHW")
    request = app_run.RunRequest(bundle, {}, OpSettings(epsilon=1e-3), OUTPUTS, app_run.Destination())
    with contextlib.ExitStack() as stack:
        prepared = app_run.prepare(request, stack)
    assert prepared.op.epsilon == 1e-3 and prepared.data_format == "NCHW"
    assert prepared.note == f"bundle ({bundle}): not used: step"


def test_onednn_without_the_parameter_gradients_ignores_gamma(rng, tmp_path):
    arrays = make_inputs(rng, (2, 3, 4, 4), "NXC")
    bundle = save_bundle(tmp_path / "b.npz", arrays)
    request = app_run.RunRequest(bundle, {}, OpSettings(epsilon=1e-3, spec="onednn"), ("diff_src",), app_run.Destination())
    with contextlib.ExitStack() as stack:
        prepared = app_run.prepare(request, stack)
    assert prepared.op.gamma is None and "gamma" not in prepared.inputs
    with_grads = app_run.RunRequest(bundle, {}, OpSettings(epsilon=1e-3, spec="onednn"), OUTPUTS, app_run.Destination())
    with contextlib.ExitStack() as stack:
        assert app_run.prepare(with_grads, stack).op.gamma is not None
