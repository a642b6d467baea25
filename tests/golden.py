"""Golden bits: a few problems built from integer arithmetic alone, and the SHA-256 of bnbwd's outputs for them.

The inputs come from a fixed integer hash of each element's index (no numpy.random streams, whose algorithms a
NumPy release may change), scaled to values every input dtype holds exactly, with full significands so that the
float64 sums round and their order shows in the bits. fixtures/golden_bits.json holds the hashes; the tests hold
every NumPy version CI installs, and every core and vector width, to them.

    python -m tests.golden --write     (only when the reduction order or rounding changes on purpose)
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

from bnbwd_cli.core import Op, Settings, backward

GOLDEN_PATH = Path(__file__).resolve().parent.parent / "fixtures" / "golden_bits.json"
DTYPES = {"f64": np.dtype(np.float64), "f32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16),
          "f16": np.dtype(np.float16)}
SIGNIFICAND_BITS = {"f64": 53, "f32": 24, "bf16": 8, "f16": 11}  # what each dtype holds exactly
# name: (shape, data_format). Planes of several chunks, NXC rows of several chunks, a short odd shape, an (N, C) one,
# and NCX rows whose spatial size (5) divides no lane group: the rows' lanes are grouped across samples, and that
# grouping shows in float64's bits.
PROBLEMS = {
    "ncx_planes": ((130, 3, 24, 24), "NCX"),
    "nxc_rows": ((16, 60, 60, 4), "NXC"),
    "ncx_odd": ((3, 5, 7, 9), "NCX"),
    "nxc_2d": ((3000, 3), "NXC"),
    "ncx_lanes_odd": ((130, 3, 5), "NCX"),
}
OUTPUTS = ("diff_src", "diff_gamma", "diff_beta")


def _hash32(index: np.ndarray, salt: int) -> np.ndarray:
    """A 32-bit integer hash of each index (uint64 arithmetic, every product below 2**64)."""
    h = (index * np.uint64(0x9E3779B1) + np.uint64(salt * 0x632BE5AB)) & np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(0x85EBCA6B)) & np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & np.uint64(0xFFFFFFFF)
    return h ^ (h >> np.uint64(16))


def exact_values(count: int, salt: int, bits: int, spread: int) -> np.ndarray:
    """float64 values of `bits` significant bits, signed, times 2**e for e in [-spread, spread]: exact in any
    dtype of that many significand bits."""
    index = np.arange(count, dtype=np.uint64)
    h = _hash32(index, salt)
    if bits <= 32:
        mantissa = (h >> np.uint64(32 - bits)).astype(np.float64)
    else:  # the high bits from a second hash: (high << 32) + low, exact below 2**53
        high = (_hash32(index, salt + 1000) >> np.uint64(64 - bits)).astype(np.float64)
        mantissa = high * 2.0**32 + h.astype(np.float64)
    mantissa -= 2.0 ** (bits - 1)
    exponent = (h & np.uint64(0xF)).astype(np.int64) % (2 * spread + 1) - spread
    return np.ldexp(mantissa / 2.0 ** (bits - 1), exponent)


def golden_op(name: str, dtype_name: str) -> Op:
    shape, data_format = PROBLEMS[name]
    dtype = DTYPES[dtype_name]
    stats_dtype = np.dtype(np.float64) if dtype_name == "f64" else np.dtype(np.float32)
    bits = SIGNIFICAND_BITS[dtype_name]
    size = int(np.prod(shape))
    channels = shape[1] if data_format == "NCX" else shape[-1]
    src = exact_values(size, 1, bits, 3).reshape(shape).astype(dtype)
    diff_dst = exact_values(size, 2, bits, 3).reshape(shape).astype(dtype)
    stats_bits = 53 if dtype_name == "f64" else 24
    mean = (exact_values(channels, 3, stats_bits, 0) / 8).astype(stats_dtype)
    variance = (1.5 + exact_values(channels, 4, stats_bits, 0) / 2).astype(stats_dtype)
    gamma = (1.0 + exact_values(channels, 5, stats_bits, 0) / 4).astype(stats_dtype)
    return Op(src, diff_dst, mean, variance, gamma, epsilon=1e-5, data_format=data_format)


def output_hashes(op: Op, settings: Settings) -> dict[str, str]:
    """SHA-256 of each output's dtype, shape and bytes."""
    result = backward(op, settings)
    if result.core != settings.core:  # e.g. float16 where numba has no half conversions: not the core asked for
        raise RuntimeError(f"asked for the {settings.core} core, {result.core} ran")
    hashes = {}
    for name in OUTPUTS:
        array = np.ascontiguousarray(getattr(result, name))
        digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
        hashes[name] = digest.hexdigest()
    return hashes


def all_hashes(core: str = "numpy", dtypes=tuple(DTYPES), problems=tuple(PROBLEMS), threads: int = 1) -> dict:
    """{"problem/dtype": {output: sha256}} for the given core."""
    return {f"{name}/{dtype}": output_hashes(golden_op(name, dtype), Settings(core=core, threads=threads))
            for name in problems for dtype in dtypes}


def load_golden() -> dict:
    return json.loads(GOLDEN_PATH.read_text(encoding="utf-8"))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        GOLDEN_PATH.write_text(json.dumps(all_hashes(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    else:  # print the hashes (a subprocess's answer, e.g. the numba core under another CPU name)
        core, dtypes, problems = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
        hashes = all_hashes(core, tuple(dtypes), tuple(problems))
        cpu_name = None
        if core == "numba":
            import numba

            cpu_name = numba.config.CPU_NAME
        print(json.dumps({"cpu_name": cpu_name, "hashes": hashes}))
