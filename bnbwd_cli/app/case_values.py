"""The values of a test case: a counter-based generator and the data recipes (`bnbwd cases`).

The same case name gives the same values on every machine and NumPy version: the stream is
splitmix64 of a counter, in NumPy uint64 arithmetic (which wraps), never numpy.random (whose
streams may change between versions); the bell-shaped values are sums of uniforms, so no libm
function (log, cos), whose last bit may differ between platforms, touches them; the batch
statistics are exact sums (math.fsum), not NumPy's pairwise sums, whose order may change.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from bnbwd_cli.dtypes import dtype_name

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
MIX_2 = np.uint64(0x94D049BB133111EB)
TO_UNIT = 2.0**-53
SQRT3 = math.sqrt(3.0)  # correctly rounded by IEEE 754, as are + - * / below

# |mean| / sd of the offset recipe, per data dtype: as large as the dtype still resolves the spread with
# a few hundred (f32) or ~8 (f16, bf16) levels per standard deviation.
OFFSET_RATIO = {"f32": 1e4, "f16": 100.0, "bf16": 30.0}
# Standard deviations of the tiny-variance recipe, cycled over the channels: variances 1e-6 .. 1e-3,
# around an epsilon of 1e-4, so that a wrong or missing epsilon moves invstd by up to ~10x.
TINY_SPREADS = (1e-3, 3e-3, 1e-2, 3e-2)


@dataclass(frozen=True)
class Recipe:
    """How a case's values are drawn.

    centre: "plain" (|mean|/sd <= ~2), "offset" (|mean|/sd = OFFSET_RATIO) or "tiny" (variance ~ epsilon);
    diff_dst: "plain" (a per-channel mean of +-0.25..1 plus noise of sd 1), "relu" (zero where the forward output
    gamma*xhat + beta <= 0), "pool" (a global average pool's gradient, constant over positions, ReLU-masked)
    or "rising" (per-channel means 1..3: running sums only grow); gamma: "varied" (0.25..2, every fourth
    channel negative), "ones", "near_one" (1 +- 0.02) or "some_zero" (varied, every third channel 0);
    stats: "batch" (the batch's exact statistics) or "shifted" (a running mean/variance: not the batch's);
    coarse: values on a coarse grid (src in steps of 1/4, diff_dst integers).
    """

    centre: str = "plain"
    diff_dst: str = "plain"
    gamma: str = "varied"
    stats: str = "batch"
    coarse: bool = False
    epsilon: float = 1e-5


def stream_key(*names: str) -> np.uint64:
    """A 64-bit key from names (a case's name and the array's): SHA-256, stable everywhere."""
    digest = hashlib.sha256("/".join(names).encode()).digest()
    return np.uint64(int.from_bytes(digest[:8], "little"))


def uniform(key: np.uint64, count: int) -> np.ndarray:
    """`count` float64 values in [0, 1): splitmix64 of key + i * golden ratio, top 53 bits."""
    with np.errstate(over="ignore"):
        z = key + np.arange(1, count + 1, dtype=np.uint64) * GOLDEN
        z = (z ^ (z >> np.uint64(30))) * MIX_1
        z = (z ^ (z >> np.uint64(27))) * MIX_2
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * TO_UNIT


def bell(key: np.uint64, count: int) -> np.ndarray:
    """`count` values of mean 0, variance 1, bell-shaped within +-3: (u1 + u2 + u3 - 1.5) * 2."""
    u = uniform(key, 3 * count).reshape(3, count)
    return (u[0] + u[1] + u[2] - 1.5) * 2.0


def to_dtype(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float64 -> the data dtype, rounded to nearest (bfloat16 through float32: both roundings are exact
    ties-to-even steps, the same everywhere)."""
    if np.dtype(dtype).name == "bfloat16":
        return values.astype(np.float32).astype(dtype)
    return values.astype(dtype)


def exact_statistics(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row mean and biased variance of a (C, M) float64 array, from correctly rounded sums."""
    m = x.shape[1]
    mean = np.array([math.fsum(row) / m for row in x.tolist()])
    centred = x - mean[:, None]
    variance = np.array([math.fsum(row) / m for row in (centred * centred).tolist()])
    return mean, variance


@dataclass(frozen=True)
class Values:
    """A case's arrays in the logical (C, N, S) order: channel first, then batch, then positions."""

    src: np.ndarray
    diff_dst: np.ndarray
    mean: np.ndarray
    variance: np.ndarray
    gamma: np.ndarray


def draw(name: str, recipe: Recipe, shape: tuple[int, int, int], dtype: np.dtype) -> Values:
    """The values of case `name`: src and diff_dst (C, N, S) in `dtype`, mean/variance/gamma (C,) float32."""
    channels, batch, positions = shape
    per_channel = uniform(stream_key(name, "channels"), 6 * channels).reshape(6, channels)
    centre, spread = _centre_and_spread(recipe, per_channel, dtype)
    noise = bell(stream_key(name, "src"), channels * batch * positions).reshape(shape)
    src64 = centre[:, None, None] + spread[:, None, None] * noise
    if recipe.coarse:
        src64 = np.round(src64 * 4.0) / 4.0
    src = to_dtype(src64, dtype)
    x = src.astype(np.float32).astype(np.float64).reshape(channels, -1)
    mean, variance = exact_statistics(x)
    gamma = _gamma(recipe.gamma, per_channel[2])
    beta = per_channel[3] - 0.5
    xhat = (x - mean[:, None]) / np.sqrt(variance[:, None] + recipe.epsilon)
    diff_dst = _diff_dst(name, recipe, per_channel[4], shape)
    if recipe.diff_dst in ("relu", "pool"):
        diff_dst = np.where((gamma[:, None] * xhat + beta[:, None]).reshape(shape) > 0, diff_dst, 0.0)
    if recipe.stats == "shifted":  # a running mean/variance: 0.1..0.5 sd off, variance 1.2..1.8x
        mean = mean + np.sqrt(variance) * (0.1 + 0.4 * per_channel[5])
        variance = variance * (1.2 + 0.6 * per_channel[5])
    return Values(src, to_dtype(diff_dst, dtype), mean.astype(np.float32), variance.astype(np.float32),
                  gamma.astype(np.float32))


def _centre_and_spread(recipe: Recipe, per_channel: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    channels = per_channel.shape[1]
    if recipe.centre == "tiny":
        spread = np.array([TINY_SPREADS[c % len(TINY_SPREADS)] for c in range(channels)])
        return spread * 3.0 * (2.0 * per_channel[0] - 1.0), spread
    spread = 0.5 + 1.5 * per_channel[1]
    if recipe.centre == "offset":
        sign = np.where(np.arange(channels) % 2 == 0, 1.0, -1.0)
        return sign * OFFSET_RATIO[dtype_name(dtype)] * spread * (1.0 + per_channel[0]), spread
    return 2.0 * per_channel[0] - 1.0, spread


def _gamma(kind: str, u: np.ndarray) -> np.ndarray:
    channels = np.arange(u.shape[0])
    varied = (0.25 + 1.75 * u) * np.where(channels % 4 == 3, -1.0, 1.0)
    if kind == "ones":
        return np.ones_like(u)
    if kind == "near_one":
        return 1.0 + 0.02 * (2.0 * u - 1.0)
    if kind == "some_zero":
        return np.where(channels % 3 == 0, 0.0, varied)
    return varied


def _diff_dst(name: str, recipe: Recipe, u: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    channels, batch, positions = shape
    centred = 2.0 * u - 1.0  # a per-channel mean of +-(0.25 .. 1): so that a missing diff_beta/M shows everywhere
    offset = 1.0 + 2.0 * u if recipe.diff_dst == "rising" else np.sign(centred) * (0.25 + 0.75 * np.abs(centred))
    if recipe.diff_dst == "pool":  # d(mean over positions)/dx: one value per (n, c), divided by the positions
        pooled = bell(stream_key(name, "diff_dst"), channels * batch).reshape(channels, batch, 1)
        values = np.broadcast_to((offset[:, None, None] + pooled) / positions, shape)
    else:
        values = offset[:, None, None] + bell(stream_key(name, "diff_dst"), channels * batch * positions).reshape(shape)
    return np.round(values) if recipe.coarse else values
