"""Writes fixtures/example_case.npz and fixtures/example_case_bad.npz, the `bnbwd check` examples, and
fixtures/pytorch_dump/ and fixtures/cases/, the examples of `bnbwd check --help` and README's PyTorch recipe.

A kernel engineer's dump: the inputs of fixtures/example.npz and a float32 kernel's outputs, all in
the kernel's own names (x, dy, var, dx, dgamma, dbeta), as README's "In pytest" section shows. The
kernel is the textbook formula in float32 (a correct kernel: it passes); the bad one divides by M-1
where M belongs in the variance it recomputes (an unbiased variance: it fails).

    python -m tools.make_example_cases               # rewrite them in fixtures/
    python -m tools.make_example_cases --out DIR     # write them under DIR instead (reads fixtures/example.npz)

The output is a function of fixtures/example.npz alone: rerunning it rewrites the same bytes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def float32_kernel(x, dy, mean, var, gamma, eps, unbiased=False):
    """NCHW batch-norm backward as a float32 kernel computes it (sums along the reduced axes in float32)."""
    axes, m = (0, 2, 3), x.size // x.shape[1]
    if unbiased:
        var = (var * m / (m - 1)).astype(np.float32)
    shape = (1, -1, 1, 1)
    invstd = (1 / np.sqrt(var + np.float32(eps))).astype(np.float32)
    xhat = (x - mean.reshape(shape)) * invstd.reshape(shape)
    dbeta = dy.sum(axis=axes, dtype=np.float32)
    dgamma = (dy * xhat).sum(axis=axes, dtype=np.float32)
    dx = (gamma * invstd).reshape(shape) * (dy - dbeta.reshape(shape) / m - xhat * dgamma.reshape(shape) / m)
    return dx.astype(np.float32), dgamma, dbeta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIXTURES, help="where to write (default %(default)s)")
    out = parser.parse_args(argv).out
    example = np.load(FIXTURES / "example.npz")
    assert str(example["data_format"]) == "NCHW"
    inputs = {"x": example["src"], "dy": example["diff_dst"], "mean": example["mean"], "var": example["variance"],
              "gamma": example["gamma"], "epsilon": example["epsilon"], "data_format": example["data_format"]}
    args = (example["src"], example["diff_dst"], example["mean"], example["variance"], example["gamma"],
            float(example["epsilon"]))
    for name, unbiased in (("example_case.npz", False), ("example_case_bad.npz", True)):
        dx, dgamma, dbeta = float32_kernel(*args, unbiased=unbiased)
        np.savez(out / name, **inputs, dx=dx, dgamma=dgamma, dbeta=dbeta)
    write_pytorch_examples(example, out)
    return 0


def torch_names(example, unbiased=False) -> dict[str, np.ndarray]:
    """The same float32 kernel's dump in PyTorch's names (native_batch_norm_backward's), with save_invstd."""
    eps = float(example["epsilon"])
    invstd = (1 / np.sqrt(example["variance"].astype(np.float64) + eps)).astype(np.float32)
    dx, dgamma, dbeta = float32_kernel(example["src"], example["diff_dst"], example["mean"], example["variance"],
                                       example["gamma"], eps, unbiased=unbiased)
    return {"input": example["src"], "grad_output": example["diff_dst"], "weight": example["gamma"],
            "bias": np.zeros_like(example["gamma"]), "save_mean": example["mean"], "save_invstd": invstd,
            "running_mean": example["mean"] * np.float32(0.1), "running_var": np.float32(0.9) + example["variance"] * np.float32(0.1),
            "grad_input": dx, "grad_weight": dgamma, "grad_bias": dbeta}


def write_pytorch_examples(example, out: Path) -> None:
    """fixtures/pytorch_dump/: one case as a folder of PyTorch-named .npy files (a hook's dump); fixtures/cases/:
    a suite, one case as NAME.npz (inputs) beside NAME.out.npz (outputs), one as a single file."""
    dump = torch_names(example)
    (out / "pytorch_dump").mkdir(exist_ok=True)
    for key, array in dump.items():
        np.save(out / "pytorch_dump" / f"{key}.npy", array)
    cases = out / "cases"
    cases.mkdir(exist_ok=True)
    outputs = ("grad_input", "grad_weight", "grad_bias")
    np.savez(cases / "bn1.npz", **{k: v for k, v in dump.items() if k not in outputs}, data_format=np.array("NCHW"))
    np.savez(cases / "bn1.out.npz", **{k: dump[k] for k in outputs})
    np.savez(cases / "bn2.npz", **dump, data_format=np.array("NCHW"))


if __name__ == "__main__":
    raise SystemExit(main())
