"""H and W swapped, both ways round: a kernel that pairs dy[h, w] with the buffer's x at w*H + h, and one that
pairs the buffer's x[h, w] with its own w*H + h (the inverse permutation), are both named spatial-axes-swapped.

tools/bugs.py plants one direction; this file plants each direction on each side (an input read, the output
written), in both layouts and in float32 and bfloat16, so the detector is not fitted to one of them.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from bnbwd_cli.judge import Judging, compare_sets
from tools import zoo
from tests.oracle import backward_arrays

N, C, H, W = 3, 5, 9, 14  # non-square: the swap moves elements


def _transposed(array: np.ndarray, fmt: str, inverse: bool) -> np.ndarray:
    """array with its H and W index swapped in the buffer: read back as (H, W) from a (W, H) buffer, or the
    inverse (the buffer of the (H, W) array's transpose)."""
    h_axis, w_axis = (2, 3) if fmt == "NCX" else (1, 2)
    shape = array.shape
    if inverse:
        return np.ascontiguousarray(np.swapaxes(array, h_axis, w_axis)).reshape(shape)
    flipped = list(shape)
    flipped[h_axis], flipped[w_axis] = shape[w_axis], shape[h_axis]
    return np.ascontiguousarray(np.swapaxes(array.reshape(flipped), h_axis, w_axis))


def _backward(problem: dict, **replaced) -> dict:
    arrays = {**{k: problem[k] for k in ("src", "diff_dst", "mean", "variance", "gamma")}, **replaced}
    result = backward_arrays(arrays["src"], arrays["diff_dst"], arrays["mean"], arrays["variance"], arrays["gamma"],
                             epsilon=problem["epsilon"], data_format=problem["data_format"], core="numpy")
    return {"diff_src": result.diff_src, "diff_gamma": result.diff_gamma, "diff_beta": result.diff_beta}


def _problem(fmt: str, dtype) -> dict:
    rng = np.random.default_rng(11)
    shape = (N, C, H, W) if fmt == "NCX" else (N, H, W, C)
    per_channel = (1, C, 1, 1) if fmt == "NCX" else (1, 1, 1, C)
    src = (rng.uniform(-2, 2, C).reshape(per_channel) + rng.standard_normal(shape)).astype(dtype)
    diff_dst = (rng.uniform(-0.5, 0.5, C).reshape(per_channel) + rng.standard_normal(shape)).astype(dtype)
    axes = (0, 2, 3) if fmt == "NCX" else (0, 1, 2)
    x64 = src.astype(np.float64)
    return {"src": src, "diff_dst": diff_dst, "mean": x64.mean(axis=axes).astype(np.float32),
            "variance": x64.var(axis=axes).astype(np.float32), "gamma": rng.uniform(0.5, 2, C).astype(np.float32),
            "epsilon": 1e-5, "data_format": fmt}


@pytest.mark.parametrize("inverse", [False, True], ids=["swapped", "inverse"])
@pytest.mark.parametrize("side", ["src", "diff_dst", "diff_src"])
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["f32", "bf16"])
def test_swapped_spatial_axes_are_named_both_ways(dtype, fmt, side, inverse):
    problem = _problem(fmt, dtype)
    if side == "diff_src":
        outputs = _backward(problem)
        outputs["diff_src"] = _transposed(outputs["diff_src"], fmt, inverse)
    else:
        outputs = _backward(problem, **{side: _transposed(problem[side], fmt, inverse)})
    result = compare_sets(outputs, _backward(problem), Judging(), inputs=zoo.inputs_of(problem))
    assert result.status == "mismatch"
    causes = {h.cause for o in result.outputs for h in o.comparison.diagnosis}
    assert causes == {"spatial-axes-swapped"}, [o.comparison.hints for o in result.outputs]
