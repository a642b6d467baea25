"""Shared fixtures: a seeded generator, the real CLI, and bundle builders."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from bnbwd_cli.cli import main


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261123)


@pytest.fixture
def cli():
    """Invoke the real CLI in-process: cli("run", "x.npz", ...) -> click Result (stderr kept apart)."""
    runner = CliRunner()

    def invoke(*args: str, input: bytes | None = None):
        return runner.invoke(main, [str(a) for a in args], input=input, catch_exceptions=True)

    return invoke


def make_inputs(rng: np.random.Generator, shape, data_format: str = "NCX", dtype=np.float32, stats_dtype=np.float32):
    """A consistent set of op inputs: src/diff_dst of `shape`, (C,) stats with realistic values."""
    channels = shape[1] if data_format == "NCX" else shape[-1]
    src = rng.normal(0.5, 2.0, size=shape).astype(dtype)
    return {
        "src": src,
        "diff_dst": rng.normal(size=shape).astype(dtype),
        "mean": rng.normal(0.5, 0.1, size=channels).astype(stats_dtype),
        "variance": rng.uniform(2.0, 6.0, size=channels).astype(stats_dtype),
        "gamma": rng.uniform(0.5, 1.5, size=channels).astype(stats_dtype),
        "beta": rng.normal(size=channels).astype(stats_dtype),
    }


def save_bundle(path, arrays: dict, **attributes) -> str:
    extra = {key: np.array(value) for key, value in attributes.items()}
    np.savez(path, **arrays, **extra)
    return str(path)
