#!/usr/bin/env python3
"""Write the framework-conformance fixtures under fixtures/conformance/.

Dev-only. Regenerating needs torch (PyTorch cases) and/or tensorflow-cpu (TensorFlow
cases); bnbwd never imports either at run time, and the tests only read what this
tool committed. --check and --report need neither.

    python -m tools.make_fixtures                   # regenerate every case it can
    python -m tools.make_fixtures --framework torch
    python -m tools.make_fixtures --check           # the committed files hold the manifest's arrays
    python -m tools.make_fixtures --reproduce       # regenerate in a temp dir, diff the manifest
    python -m tools.make_fixtures --report          # run bnbwd on every case, rewrite the
                                                    # table in docs/conformance.md

Each case is one bundle (`<name>.inputs.npz`, canonical bnbwd names) and the
framework's outputs (`<name>.expected.npz`: diff_src, diff_gamma, diff_beta).
`manifest.json` holds, per case: provenance (framework, version, op, arguments,
seed), how to run bnbwd on it (spec profile and flags), the tolerance the tests
apply, a SHA-256 of every array, and the max normalised difference between the
framework and a float64 NumPy oracle of the formula in docs/choices.md.

Determinism: inputs come from numpy's default_rng(seed); frameworks run on one
thread; npz files are written with a fixed zip timestamp. The manifest holds no
timestamps, so a regeneration on the same framework versions reproduces it
byte for byte (`--reproduce`).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bnbwd_cli.core import Op
from bnbwd_cli.core.reference import reference_backward
from bnbwd_cli.dtypes import BFLOAT16, to_float64
from tools.accuracy import normalised_error
from tools.torch_bridge import to_numpy, to_torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "conformance"
DOC = ROOT / "docs" / "conformance.md"
TABLE_BEGIN = "<!-- conformance-table:begin (tools/make_fixtures.py --report) -->"
TABLE_END = "<!-- conformance-table:end -->"
BEYOND_BEGIN = "<!-- beyond-rounding:begin (tools/make_fixtures.py --report) -->"
BEYOND_END = "<!-- beyond-rounding:end -->"
SUMMARY_BEGIN = "<!-- summary:begin (tools/make_fixtures.py --report) -->"
SUMMARY_END = "<!-- summary:end -->"

BF16 = BFLOAT16
DTYPES = {"float64": np.dtype(np.float64), "float32": np.dtype(np.float32),
          "float16": np.dtype(np.float16), "bfloat16": BF16}

# Bound on max|bnbwd - framework| / max|framework| per output, by the output's
# dtype. float16/bfloat16: both sides round a float32 result once and may land
# one ulp apart; the bound is two ulps of the largest element (2**-9, 2**-6;
# 1.6e-2 is also torch.testing's bf16 rtol). float32: the products and xhat are
# rounded to float32 on every side, and the channel sums cancel (diff_dst has
# zero mean), so the sums differ by up to ~sqrt(M) * 2**-24 relative to the
# largest sum: 7.6e-6 at M = 16384, the largest M here. float64: the same
# argument with 2**-53, with room to spare.
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
# The framework vs float64 oracle check while generating is only a sanity
# bound (a wrong fixture is off by O(1)); the measured value goes in the manifest.
ORACLE_SANITY = 10.0
# "More than rounding" in the docs: a normalised difference above this many ulps
# (of the output dtype, at the largest element: 2**-mantissa_bits) of the output.
ROUNDING_ULPS = 4
MANTISSA_BITS = {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7}
OUTPUTS = ("diff_src", "diff_gamma", "diff_beta")


@dataclass(frozen=True)
class Case:
    """One fixture. `shape` is logical (N, C, X...); `layout` is how it is stored."""

    name: str
    framework: str  # "pytorch" | "tensorflow"
    shape: tuple[int, ...]
    layout: str  # "NCX" (contiguous / NCHW) or "NXC" (channels-last / NHWC)
    dtype: str  # T1: src, diff_dst, diff_src
    stats_dtype: str  # T2: mean, variance, gamma, diff_gamma, diff_beta
    train: bool
    epsilon: float
    seed: int
    gamma: bool = True
    convention: str = "variance"  # or "invstd": bundle's `variance` holds 1/sqrt(var+eps)
    # How the bundle carries attributes: a key listed here is left out of the
    # bundle so the spec profile's default (or a CLI flag) must supply it.
    omit: tuple[str, ...] = ()
    epsilon_flag: bool = False  # pass --epsilon on the command line instead of the bundle
    note: str = ""


def _torch_cases() -> list[Case]:
    c = []
    f32, f64, bf, f16 = "float32", "float64", "bfloat16", "float16"
    c.append(Case("torch_nc_f32_train", "pytorch", (64, 16), "NCX", f32, f32, True, 1e-5, 101))
    c.append(Case("torch_ncw_f32_train", "pytorch", (4, 8, 32), "NCX", f32, f32, True, 1e-5, 102))
    c.append(Case("torch_nchw_f32_train", "pytorch", (4, 8, 6, 6), "NCX", f32, f32, True, 1e-5, 103))
    c.append(Case("torch_ncdhw_f32_train", "pytorch", (2, 4, 3, 4, 5), "NCX", f32, f32, True, 1e-5, 104))
    c.append(Case("torch_cl_nhwc_f32_train", "pytorch", (4, 8, 6, 6), "NXC", f32, f32, True, 1e-5, 105))
    c.append(Case("torch_cl_ndhwc_f32_train", "pytorch", (2, 4, 3, 4, 5), "NXC", f32, f32, True, 1e-5, 106))
    c.append(Case("torch_nchw_f64_train", "pytorch", (4, 8, 6, 6), "NCX", f64, f64, True, 1e-5, 107))
    c.append(Case("torch_nc_f64_eval", "pytorch", (64, 16), "NCX", f64, f64, False, 1e-3, 108))
    c.append(Case("torch_nchw_bf16_train", "pytorch", (4, 8, 6, 6), "NCX", bf, f32, True, 1e-5, 109))
    c.append(Case("torch_cl_nhwc_bf16_train", "pytorch", (4, 8, 6, 6), "NXC", bf, f32, True, 1e-5, 110))
    c.append(Case("torch_nchw_bf16_eval", "pytorch", (4, 8, 6, 6), "NCX", bf, f32, False, 1e-5, 111))
    c.append(Case("torch_nchw_f16_train", "pytorch", (4, 8, 6, 6), "NCX", f16, f32, True, 1e-5, 112))
    c.append(Case("torch_nchw_f32_nogamma_train", "pytorch", (4, 8, 6, 6), "NCX", f32, f32, True, 1e-5, 113,
                  gamma=False))
    c.append(Case("torch_nchw_bf16_nogamma_train", "pytorch", (4, 8, 6, 6), "NCX", bf, f32, True, 1e-5, 114,
                  gamma=False))
    c.append(Case("torch_nchw_f32_nogamma_eval", "pytorch", (4, 8, 6, 6), "NCX", f32, f32, False, 1e-5, 115,
                  gamma=False))
    c.append(Case("torch_nchw_f32_eval", "pytorch", (4, 8, 6, 6), "NCX", f32, f32, False, 1e-5, 116))
    c.append(Case("torch_cl_nhwc_f32_eval", "pytorch", (4, 8, 6, 6), "NXC", f32, f32, False, 1e-5, 117))
    c.append(Case("torch_nchw_f32_invstd_train", "pytorch", (4, 8, 6, 6), "NCX", f32, f32, True, 1e-5, 118,
                  convention="invstd", note="bundle holds save_invstd as `variance`; run with --variance-is-invstd"))
    c.append(Case("torch_ncdhw_f32_invstd_eps_flag_train", "pytorch", (2, 4, 3, 4, 5), "NCX", f32, f32, True, 1e-3,
                  119, convention="invstd", omit=("epsilon",), epsilon_flag=True,
                  note="invstd convention, epsilon given as --epsilon (unused by the math)"))
    c.append(Case("torch_nchw_f32_largeM_train", "pytorch", (4, 2, 64, 64), "NCX", f32, f32, True, 1e-5, 120,
                  note="M = 16384 per channel, inputs offset by 3 to stress accumulation"))
    return c


def _tf_cases() -> list[Case]:
    c = []
    seed = 200
    count = 0
    for dtype in ("float32", "float16", "bfloat16"):
        short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dtype]
        for layout, fmt in (("NXC", "nhwc"), ("NCX", "nchw")):
            for train in (True, False):
                seed += 1
                if layout == "NCX" and not train:
                    continue  # TF's CPU kernel rejects NCHW with is_training=False
                # Alternate TF's default epsilon (left out of the bundle, so the
                # tensorflow profile's 1e-4 applies) with a non-default one.
                count += 1
                default_eps = count % 2 == 1
                omit = ("epsilon",) if default_eps else ()
                if layout == "NXC":
                    omit = omit + ("data_format",)  # the profile's NHWC default applies
                name = f"tf_{fmt}_{short}_{'train' if train else 'eval'}" + ("" if default_eps else "_eps1e-3")
                c.append(Case(name, "tensorflow", (4, 8, 6, 6), layout, dtype, "float32", train,
                              1e-4 if default_eps else 1e-3, seed, omit=omit))
    c.append(Case("tf_nhwc_f32_train_eps_flag", "tensorflow", (3, 5, 5, 12), "NXC", "float32", "float32", True, 3e-2,
                  240, omit=("epsilon", "data_format"), epsilon_flag=True, note="epsilon given as --epsilon"))
    c.append(Case("tf_nhwc_f32_largeM_train", "tensorflow", (4, 2, 64, 64), "NXC", "float32", "float32", True, 1e-4,
                  241, omit=("epsilon", "data_format"), note="M = 16384 per channel, inputs offset by 3"))
    c.append(Case("tf_nchw_bf16_largeM_train", "tensorflow", (8, 4, 32, 32), "NCX", "bfloat16", "float32", True,
                  1e-4, 242, omit=("epsilon",), note="M = 8192 per channel in bf16"))
    c.append(Case("tf_ndhwc_f32_train_5d", "tensorflow", (2, 4, 3, 4, 5), "NXC", "float32", "float32", True, 1e-3,
                  243, note="5-D: accepted by TF's CPU kernel though not in its documented spec; run with --spec generic"))
    c.append(Case("tf_ncdhw_bf16_train_5d", "tensorflow", (2, 4, 3, 4, 5), "NCX", "bfloat16", "float32", True, 1e-3,
                  244, note="5-D: accepted by TF's CPU kernel though not in its documented spec; run with --spec generic"))
    return c


# ---------------------------------------------------------------- inputs and oracle


def _to_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    return a.astype(DTYPES[dtype])


def _physical(a: np.ndarray, layout: str) -> np.ndarray:
    """Logical (N, C, X...) -> stored array (channels-last for NXC)."""
    if layout == "NCX":
        return np.ascontiguousarray(a)
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def _logical(a: np.ndarray, layout: str) -> np.ndarray:
    return a if layout == "NCX" else np.moveaxis(a, -1, 1)


def make_inputs(case: Case) -> dict[str, np.ndarray]:
    """Logical-layout inputs, already rounded to their dtypes.

    Training: mean/variance are the batch statistics of the rounded src (as a
    forward pass would save them). Inference: arbitrary running statistics.
    """
    rng = np.random.default_rng(case.seed)
    ch = case.shape[1]
    offset = 3.0 if "largeM" in case.name else 0.0
    chan = (1, ch) + (1,) * (len(case.shape) - 2)
    loc = rng.uniform(-1.0, 1.0, ch).reshape(chan) + offset
    scale = rng.uniform(0.5, 2.0, ch).reshape(chan)
    src = _to_dtype(loc + scale * rng.standard_normal(case.shape), case.dtype)
    diff_dst = _to_dtype(rng.standard_normal(case.shape), case.dtype)
    gamma = _to_dtype(rng.uniform(0.5, 1.5, ch), case.stats_dtype)
    axes = (0,) + tuple(range(2, len(case.shape)))
    if case.train:
        mean64 = to_float64(src).mean(axis=axes)
        var64 = to_float64(src).var(axis=axes)
    else:
        mean64 = loc.reshape(ch) + rng.uniform(-0.2, 0.2, ch)
        var64 = (scale.reshape(ch) ** 2) * rng.uniform(0.7, 1.3, ch)
    return {"src": src, "diff_dst": diff_dst, "mean": _to_dtype(mean64, case.stats_dtype),
            "variance": _to_dtype(var64, case.stats_dtype), "gamma": gamma}


def invstd_of(variance: np.ndarray, epsilon: float) -> np.ndarray:
    """1/sqrt(variance + eps) in float64, rounded once to variance's dtype."""
    return (1.0 / np.sqrt(variance.astype(np.float64) + epsilon)).astype(variance.dtype)


def oracle(inputs: dict[str, np.ndarray], epsilon: float, train: bool, gamma: bool) -> dict[str, np.ndarray]:
    """The package's float64 oracle (bnbwd_cli.core.reference) on logical (N, C, X...) arrays."""
    return reference_backward(Op(inputs["src"], inputs["diff_dst"], inputs["mean"], inputs["variance"],
                              inputs["gamma"] if gamma else None, epsilon=epsilon, data_format="NCX", training=train))


def normalised_diff(actual: np.ndarray, reference: np.ndarray) -> float:
    """max|actual - reference| / max|reference| in float64 (plain max if reference is all 0)."""
    return normalised_error(actual, to_float64(reference))


# ---------------------------------------------------------------- frameworks


def run_torch(case: Case, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict]:
    """torch.ops.aten.native_batch_norm_backward on logical arrays; returns logical outputs and the op's args."""
    import torch

    torch.set_num_threads(1)
    op = torch.ops.aten.native_batch_norm_backward
    src = to_torch(torch, inputs["src"])
    dy = to_torch(torch, inputs["diff_dst"])
    memory_format = "contiguous_format"
    if case.layout == "NXC":
        fmt = torch.channels_last if src.ndim == 4 else torch.channels_last_3d
        memory_format = "channels_last" if src.ndim == 4 else "channels_last_3d"
        src, dy = src.contiguous(memory_format=fmt), dy.contiguous(memory_format=fmt)
    weight = to_torch(torch, inputs["gamma"]) if case.gamma else None
    mean = to_torch(torch, inputs["mean"])
    if case.train:
        save_invstd = to_torch(torch, invstd_of(inputs["variance"], case.epsilon))
        outs = op(dy, src, weight, None, None, mean, save_invstd, True, case.epsilon, [True, True, True])
        stats = "save_mean=mean, save_invstd=1/sqrt(variance+eps) computed in float64 and rounded to T2"
    else:
        running_var = to_torch(torch, inputs["variance"])
        outs = op(dy, src, weight, mean, running_var, None, None, False, case.epsilon, [True, True, True])
        stats = "running_mean=mean, running_var=variance"
    result = dict(zip(OUTPUTS, (to_numpy(t) for t in outs)))
    args = {
        "grad_out": f"diff_dst ({case.dtype}, {memory_format})",
        "input": f"src ({case.dtype}, {memory_format})",
        "weight": f"gamma ({case.stats_dtype})" if case.gamma else None,
        "stats": stats,
        "train": case.train,
        "eps": case.epsilon,
        "output_mask": [True, True, True],
        "torch.get_num_threads": 1,
    }
    return result, args


def _tf_format(case: Case) -> str:
    """TensorFlow's spelling of the case's layout (NHWC/NCHW, NDHWC/NCDHW for 5-D)."""
    if len(case.shape) == 5:
        return "NDHWC" if case.layout == "NXC" else "NCDHW"
    return "NHWC" if case.layout == "NXC" else "NCHW"


def run_tf(case: Case, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict]:
    """tf.raw_ops.FusedBatchNormGradV3 on logical arrays; returns logical outputs and the op's args."""
    import tensorflow as tf

    dtype = {"float32": tf.float32, "float16": tf.float16, "bfloat16": tf.bfloat16}[case.dtype]
    data_format = _tf_format(case)

    def t(a: np.ndarray, dt):
        if a.dtype == BF16:
            return tf.cast(tf.constant(a.astype(np.float32)), tf.bfloat16)  # exact: values are bf16
        return tf.constant(a, dtype=dt)

    outs = tf.raw_ops.FusedBatchNormGradV3(
        y_backprop=t(_physical(inputs["diff_dst"], case.layout), dtype),
        x=t(_physical(inputs["src"], case.layout), dtype),
        scale=t(inputs["gamma"], tf.float32),
        reserve_space_1=t(inputs["mean"], tf.float32),
        reserve_space_2=t(inputs["variance"], tf.float32),
        reserve_space_3=tf.zeros([0], tf.float32),
        epsilon=case.epsilon,
        data_format=data_format,
        is_training=case.train,
    )

    def back(x):
        if x.dtype == tf.bfloat16:
            return tf.cast(x, tf.float32).numpy().astype(BF16)  # exact
        return x.numpy()

    result = {
        "diff_src": _logical(back(outs[0]), case.layout),
        "diff_gamma": back(outs[1]),
        "diff_beta": back(outs[2]),
    }
    args = {
        "y_backprop": f"diff_dst ({case.dtype})",
        "x": f"src ({case.dtype})",
        "scale": "gamma (float32)",
        "reserve_space_1": "mean (float32)",
        "reserve_space_2": "variance (float32)",
        "reserve_space_3": "empty float32",
        "epsilon": case.epsilon,
        "data_format": data_format,
        "is_training": case.train,
        "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
        "intra_op_parallelism_threads": 1,
    }
    return result, args


def framework_info(framework: str) -> dict:
    if framework == "pytorch":
        import torch

        return {"framework": "pytorch", "framework_version": torch.__version__,
                "op": "torch.ops.aten.native_batch_norm_backward (CPU)"}
    import tensorflow as tf

    return {"framework": "tensorflow", "framework_version": tf.__version__,
            "op": "tf.raw_ops.FusedBatchNormGradV3 (CPU)"}


def available(framework: str) -> bool:
    try:
        if framework == "pytorch":
            import torch  # noqa: F401 - imported only to see whether it is installed
        else:
            _tf_setup()
            import tensorflow  # noqa: F401 - imported only to see whether it is installed
    except ImportError:
        return False
    return True


_TF_READY = False


def _tf_setup() -> None:
    """Eigen's CPU kernel (not oneDNN), one thread: reproducible and what TF documents."""
    global _TF_READY
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if _TF_READY:
        return
    try:
        import tensorflow as tf
    except ImportError:
        return
    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass  # already initialised
    _TF_READY = True


# ---------------------------------------------------------------- files


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez with a fixed zip timestamp, so regenerated files are byte-identical."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asanyarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


def bundle_for(case: Case, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What bnbwd reads: canonical names, stored in the case's physical layout."""
    b = {"src": _physical(inputs["src"], case.layout), "diff_dst": _physical(inputs["diff_dst"], case.layout),
         "mean": inputs["mean"]}
    b["variance"] = invstd_of(inputs["variance"], case.epsilon) if case.convention == "invstd" else inputs["variance"]
    if case.gamma:
        b["gamma"] = inputs["gamma"]
    if "epsilon" not in case.omit:
        b["epsilon"] = np.array(case.epsilon, dtype=np.float64)
    if "data_format" not in case.omit:
        # Each framework's own spelling: the tensorflow profile knows only NHWC/NCHW.
        b["data_format"] = np.array(_tf_format(case) if case.framework == "tensorflow" else case.layout)
    return b


def cli_args(case: Case) -> list[str]:
    # TF's op accepts 5-D (NDHWC/NCDHW) on CPU, but its documented spec (and
    # bnbwd's tensorflow profile) is 4-D only: run those under generic.
    tf_profile = case.framework == "tensorflow" and len(case.shape) == 4
    args = ["--spec", "tensorflow" if tf_profile else "generic"]
    if case.epsilon_flag:
        args += ["--epsilon", repr(case.epsilon)]
    if not case.train:
        args.append("--inference")
    if case.convention == "invstd":
        args.append("--variance-is-invstd")
    return args


def tolerance(case: Case) -> dict[str, float]:
    return {"diff_src": TOLERANCE[case.dtype], "diff_gamma": TOLERANCE[case.stats_dtype],
            "diff_beta": TOLERANCE[case.stats_dtype]}


def generate(case: Case, out_dir: Path) -> dict:
    inputs = make_inputs(case)
    runner = run_torch if case.framework == "pytorch" else run_tf
    outputs, op_args = runner(case, inputs)
    for key, arr in outputs.items():
        expected = DTYPES[case.dtype] if key == "diff_src" else DTYPES[case.stats_dtype]
        assert arr.dtype == expected, f"{case.name}: {key} is {arr.dtype}, expected {expected}"
    want = oracle(inputs, case.epsilon, case.train, case.gamma)
    bundle = bundle_for(case, inputs)
    expected = {"diff_src": _physical(outputs["diff_src"], case.layout),
                "diff_gamma": outputs["diff_gamma"], "diff_beta": outputs["diff_beta"]}
    save_npz(out_dir / f"{case.name}.inputs.npz", bundle)
    save_npz(out_dir / f"{case.name}.expected.npz", expected)
    vs_oracle = {k: normalised_diff(outputs[k], want[k]) for k in OUTPUTS}
    # A framework far from the formula means the fixture (or our reading of
    # the op's conventions) is wrong, not that the framework rounds differently.
    for k, v in vs_oracle.items():
        assert v <= ORACLE_SANITY * tolerance(case)[k], f"{case.name}: {k} framework vs float64 oracle {v:.3g}"
    m = int(np.prod(case.shape)) // case.shape[1]
    return {
        "name": case.name,
        **framework_info(case.framework),
        "args": op_args,
        "seed": case.seed,
        "inputs": "numpy.random.default_rng(seed): src = loc_c + scale_c * N(0,1), diff_dst = N(0,1), "
                  "gamma ~ U(0.5, 1.5); training stats are the float64 batch stats of the rounded src",
        "shape": list(case.shape),
        "M": m,
        "layout": case.layout,
        "stored_shape": list(bundle["src"].shape),
        "dtype": case.dtype,
        "stats_dtype": case.stats_dtype,
        "train": case.train,
        "gamma": case.gamma,
        "epsilon": case.epsilon,
        "variance_convention": case.convention,
        "note": case.note,
        "bundle": f"{case.name}.inputs.npz",
        "bundle_keys": sorted(bundle),
        "expected": f"{case.name}.expected.npz",
        "bnbwd_args": cli_args(case),
        "tolerance": tolerance(case),
        "framework_vs_oracle": vs_oracle,
        "sha256": {**{f"inputs/{k}": _sha(v) for k, v in bundle.items()},
                   **{f"expected/{k}": _sha(v) for k, v in expected.items()}},
    }


def write_manifest(path: Path, entries: list[dict]) -> None:
    doc = {
        "about": "bnbwd conformance fixtures; written by tools/make_fixtures.py, do not edit by hand",
        "normalised_difference": "max|a - b| / max|b| per output, after upcasting both to float64",
        "cases": entries,
    }
    path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")


def load_manifest(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return json.loads(path.read_text())["cases"]


def entry_problems(entry: dict, fixtures: Path) -> list[str]:
    """What differs between one manifest entry and its two files: arrays added, lost or changed."""
    problems = []
    for part, prefix in (("bundle", "inputs"), ("expected", "expected")):
        path = fixtures / entry[part]
        try:
            with np.load(path, allow_pickle=False) as z:
                digests = {f"{prefix}/{key}": _sha(z[key]) for key in z.files}
        except (OSError, ValueError, zipfile.BadZipFile) as error:
            problems.append(f"{entry[part]}: unreadable ({type(error).__name__}: {error})")
            continue
        recorded = {key: value for key, value in entry["sha256"].items() if key.startswith(prefix + "/")}
        for key in sorted(recorded.keys() - digests.keys()):
            problems.append(f"{entry[part]}: {key.split('/', 1)[1]} is missing")
        for key in sorted(digests.keys() - recorded.keys()):
            problems.append(f"{entry[part]}: {key.split('/', 1)[1]} is not in the manifest")
        for key in sorted(recorded.keys() & digests.keys()):
            if recorded[key] != digests[key]:
                problems.append(f"{entry[part]}: {key.split('/', 1)[1]} changed (SHA-256 differs from the manifest's)")
        if part == "bundle" and {key.split("/", 1)[1] for key in digests} != set(entry["bundle_keys"]):
            problems.append(f"{entry[part]}: keys {sorted(k.split('/', 1)[1] for k in digests)} "
                            f"are not the manifest's bundle_keys {entry['bundle_keys']}")
    return problems


def check(fixtures: Path) -> list[str]:
    """Every committed file against the manifest: each array's SHA-256, and no file the manifest does not name."""
    try:
        entries = load_manifest(fixtures / "manifest.json")
    except (ValueError, KeyError) as error:
        return [f"{fixtures / 'manifest.json'}: unreadable ({type(error).__name__}: {error})"]
    if not entries:
        return [f"{fixtures / 'manifest.json'}: no cases"]
    problems = [problem for entry in entries for problem in entry_problems(entry, fixtures)]
    named = {entry[part] for entry in entries for part in ("bundle", "expected")}
    problems += [f"{path.name}: not in the manifest" for path in sorted(fixtures.glob("*.npz")) if path.name not in named]
    return problems


def all_cases() -> list[Case]:
    return _torch_cases() + _tf_cases()


def regenerate(out_dir: Path, frameworks: list[str], keep_from: Path | None) -> list[dict]:
    """Generate the cases of `frameworks`; keep other frameworks' entries (and files) from `keep_from`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    old = {e["name"]: e for e in load_manifest(keep_from / "manifest.json")} if keep_from else {}
    entries = []
    for case in all_cases():
        if case.framework in frameworks:
            print(f"  {case.name}", file=sys.stderr)
            entries.append(generate(case, out_dir))
        elif case.name in old:
            entry = old[case.name]
            if keep_from.resolve() != out_dir.resolve():
                for key in ("bundle", "expected"):
                    shutil.copy2(keep_from / entry[key], out_dir / entry[key])
            entries.append(entry)
    write_manifest(out_dir / "manifest.json", entries)
    return entries


# ---------------------------------------------------------------- bnbwd report


def run_bnbwd(entry: dict, fixtures: Path, work: Path) -> dict[str, np.ndarray]:
    """`bnbwd run` through the real CLI (click's CliRunner), as the tests do."""
    from click.testing import CliRunner

    from bnbwd_cli.cli import main

    out = work / f"{entry['name']}.out.npz"
    result = CliRunner().invoke(main, ["run", str(fixtures / entry["bundle"]), *entry["bnbwd_args"], "-o", str(out)])
    if result.exit_code != 0:
        raise RuntimeError(f"{entry['name']}: bnbwd run exited {result.exit_code}: {result.output}")
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


def _load_npz(path: Path, bf16_keys: set[str]) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k].view(BF16) if k in bf16_keys and z[k].dtype.kind == "V" else z[k] for k in z.files}


def _bf16_keys(entry: dict) -> set[str]:
    keys = set()
    if entry["dtype"] == "bfloat16":
        keys |= {"src", "diff_dst", "diff_src"}
    if entry["stats_dtype"] == "bfloat16":
        keys |= {"mean", "variance", "gamma", "diff_gamma", "diff_beta"}
    return keys


def report(fixtures: Path) -> list[dict]:
    """Run bnbwd on every case; return rows for the docs table."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for entry in load_manifest(fixtures / "manifest.json"):
            bf16 = _bf16_keys(entry)
            got = run_bnbwd(entry, fixtures, Path(tmp))
            got = {k: v.view(BF16) if k in bf16 and v.dtype.kind == "V" else v for k, v in got.items()}
            ref = _load_npz(fixtures / entry["expected"], bf16)
            bundle = _load_npz(fixtures / entry["bundle"], bf16)
            layout = entry["layout"]
            inputs = {"src": _logical(bundle["src"], layout), "diff_dst": _logical(bundle["diff_dst"], layout),
                      "mean": bundle["mean"], "gamma": bundle.get("gamma"),
                      "variance": bundle["variance"]}
            eps = entry["epsilon"]
            if entry["variance_convention"] == "invstd":
                # invstd = 1/sqrt(v + eps)  <=>  v = invstd**-2 - eps; the oracle only uses v + eps.
                inputs["variance"] = to_float64(bundle["variance"]) ** -2 - eps
            want = oracle(inputs, eps, entry["train"], entry["gamma"])
            got_logical = dict(got, diff_src=_logical(got["diff_src"], layout))
            rows.append({"entry": entry,
                         "bnbwd_vs_framework": {k: normalised_diff(got[k], ref[k]) for k in OUTPUTS},
                         "bnbwd_vs_oracle": {k: normalised_diff(got_logical[k], want[k]) for k in OUTPUTS}})
    return rows


def _fmt(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}"


def _out_dtype(entry: dict, key: str) -> str:
    return entry["dtype"] if key == "diff_src" else entry["stats_dtype"]


def rounding_bound(entry: dict, key: str) -> float:
    return ROUNDING_ULPS * 2.0 ** -MANTISSA_BITS[_out_dtype(entry, key)]


def render_table(rows: list[dict]) -> str:
    head = ("| case | framework / op | layout | T1 / T2 | mode | M | bnbwd vs framework | "
            "framework vs float64 oracle | bnbwd vs float64 oracle | test bound (diff_src / T2) |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for row in rows:
        e = row["entry"]
        op = "PyTorch `native_batch_norm_backward`" if e["framework"] == "pytorch" else "TF `FusedBatchNormGradV3`"
        mode = ("train" if e["train"] else "eval") + ("" if e["gamma"] else ", no gamma")
        if e["variance_convention"] == "invstd":
            mode += ", invstd"
        if e["epsilon"] not in (1e-5, 1e-4):
            mode += f", eps={e['epsilon']:g}"

        def cols(d: dict) -> str:
            return " / ".join(_fmt(d[k]) for k in OUTPUTS)

        lines.append(
            f"| `{e['name']}` | {op} {e['framework_version']} | {_layout_label(e)} | {_short(e['dtype'])} / "
            f"{_short(e['stats_dtype'])} | {mode} | {e['M']} | {cols(row['bnbwd_vs_framework'])} "
            f"| {cols(e['framework_vs_oracle'])} | {cols(row['bnbwd_vs_oracle'])} "
            f"| {e['tolerance']['diff_src']:g} / {e['tolerance']['diff_gamma']:g} |")
    return head + "\n".join(lines) + "\n"


def render_beyond_rounding(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        e = row["entry"]
        for k in OUTPUTS:
            d = row["bnbwd_vs_framework"][k]
            if d > rounding_bound(e, k):
                lines.append(f"- `{e['name']}` {k} ({_short(_out_dtype(e, k))}, M = {e['M']}): bnbwd vs framework "
                             f"{_fmt(d)}; framework vs oracle {_fmt(e['framework_vs_oracle'][k])}, "
                             f"bnbwd vs oracle {_fmt(row['bnbwd_vs_oracle'][k])}")
    return "\n".join(lines) + "\n" if lines else "- none\n"


def _short(dtype: str) -> str:
    return {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dtype]


def _layout_label(e: dict) -> str:
    rank = len(e["shape"])
    names = {2: ("NC", "NC"), 3: ("NCW", "NWC"), 4: ("NCHW", "NHWC"), 5: ("NCDHW", "NDHWC")}[rank]
    if e["framework"] == "pytorch" and e["layout"] == "NXC":
        return f"{names[1]} (channels_last)"
    return names[0] if e["layout"] == "NCX" else names[1]


def _replace_between(text: str, begin: str, end: str, body: str) -> str:
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + "\n" + body + text[stop:]


def write_doc(rows: list[dict]) -> None:
    text = DOC.read_text()
    text = _replace_between(text, TABLE_BEGIN, TABLE_END, render_table(rows))
    text = _replace_between(text, BEYOND_BEGIN, BEYOND_END, render_beyond_rounding(rows))
    text = _replace_between(text, SUMMARY_BEGIN, SUMMARY_END, render_summary(rows))
    DOC.write_text(text)


def render_summary(rows: list[dict]) -> str:
    """Worst bnbwd-vs-framework difference per framework, output and dtype."""
    worst: dict[tuple[str, str, str], tuple[float, str]] = {}
    for row in rows:
        e = row["entry"]
        for k in OUTPUTS:
            key = (e["framework"], k, _short(_out_dtype(e, k)))
            d = row["bnbwd_vs_framework"][k]
            if key not in worst or d > worst[key][0]:
                worst[key] = (d, e["name"])
    lines = ["| framework | output | dtype | max normalised bnbwd vs framework | case |", "|---|---|---|---|---|"]
    for key in sorted(worst):
        d, name = worst[key]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {_fmt(d)} | `{name}` |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--framework", choices=["torch", "tf", "all"], default="all")
    p.add_argument("--out", type=Path, default=FIXTURES)
    p.add_argument("--check", action="store_true",
                   help="verify the committed files against the manifest's SHA-256 of every array (no framework needed)")
    p.add_argument("--reproduce", action="store_true",
                   help="regenerate into a temporary directory and compare the manifest with the committed one")
    p.add_argument("--report", action="store_true",
                   help="run bnbwd on every committed case and rewrite the table in docs/conformance.md")
    a = p.parse_args(argv)
    if a.check:
        problems = check(a.out)
        for problem in problems:
            print(problem)
        if problems:
            print(f"{len(problems)} difference(s) from {a.out / 'manifest.json'}")
            return 1
        print(f"every array of {len(load_manifest(a.out / 'manifest.json'))} cases matches {a.out / 'manifest.json'}")
        return 0
    if a.report:
        rows = report(a.out)
        write_doc(rows)
        print(render_summary(rows))
        print(render_beyond_rounding(rows))
        return 0
    wanted = {"torch": ["pytorch"], "tf": ["tensorflow"], "all": ["pytorch", "tensorflow"]}[a.framework]
    if "tensorflow" in wanted:
        _tf_setup()
    frameworks = [f for f in wanted if available(f)]
    for f in sorted(set(wanted) - set(frameworks)):
        print(f"warning: {f} is not installed; keeping its committed cases", file=sys.stderr)
    if a.reproduce:
        with tempfile.TemporaryDirectory() as tmp:
            regenerate(Path(tmp), frameworks, a.out)
            same = (Path(tmp) / "manifest.json").read_bytes() == (a.out / "manifest.json").read_bytes()
            print("manifest reproduced" if same else "manifest DIFFERS from the committed one")
            if not same:
                import difflib

                sys.stdout.writelines(difflib.unified_diff(
                    (a.out / "manifest.json").read_text().splitlines(True),
                    (Path(tmp) / "manifest.json").read_text().splitlines(True), "committed", "regenerated"))
            return 0 if same else 1
    entries = regenerate(a.out, frameworks, a.out)
    total = sum((a.out / e[k]).stat().st_size for e in entries for k in ("bundle", "expected"))
    print(f"{len(entries)} cases, {total / 1e6:.2f} MB in {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
