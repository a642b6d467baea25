"""What each spec allows (bnbwd_cli/spec.py), called directly: one table of the six profiles (their names for the
inputs and outputs, defaults, layouts, dtype pairs, required inputs), then tables of the inputs, bundle
attributes and keys that spec.py refuses, each with its one-line message.

The profile table is docs/usage.md's ("Inputs, names and layouts" and "Spec profiles"), written out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

from bnbwd_cli.errors import InputError
from bnbwd_cli.judge.keys import canonical_key
from bnbwd_cli.layout import FORMAT_ALIASES
from bnbwd_cli.spec import (
    PROFILES,
    canonical_input_name,
    check_bundle_keys,
    check_epsilon,
    inputs_from_bundle,
    is_input_key,
    looks_like_gamma,
    read_attributes,
    resolve_epsilon,
    suggest_key,
    validate_inputs,
)

DTYPES = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16), "f32": np.dtype(np.float32),
          "f64": np.dtype(np.float64)}
ALL_PAIRS = frozenset((a, b) for a in DTYPES for b in DTYPES)
ALL_FORMATS = frozenset(FORMAT_ALIASES)
NCX_FORMATS = frozenset({"NCX", "NC", "NCW", "NCHW", "NCDHW"})
CANONICAL_INPUTS = {name: name for name in ("src", "diff_dst", "mean", "variance", "gamma", "beta")}
CANONICAL_OUTPUTS = {name: name for name in ("diff_src", "diff_gamma", "diff_beta")}
DELTA_OUTPUTS = {"diff_src": "input_delta", "diff_gamma": "gamma_delta", "diff_beta": "beta_delta"}


@dataclass(frozen=True)
class SpecRow:
    """One spec as its documentation has it."""

    name: str
    inputs: dict[str, str]  # canonical name -> the spec's name for it
    outputs: dict[str, str]  # canonical name -> the spec's name for it
    default_format: str
    default_epsilon: float | None  # None: epsilon must be given
    epsilon_is_f32: bool
    formats: frozenset[str]
    type_pairs: frozenset[tuple[str, str]]  # (src, mean/variance) dtypes it allows
    required: tuple[str, ...]  # of the optional inputs gamma and beta
    paired_param_grads: bool  # diff_gamma and diff_beta both or neither
    same_param_dtypes: bool  # gamma and beta in mean's dtype


SPECS = [
    SpecRow("generic", CANONICAL_INPUTS, CANONICAL_OUTPUTS, "NXC", None, False, ALL_FORMATS, ALL_PAIRS, (), False,
            False),
    SpecRow("ngraph", {"src": "input", "diff_dst": "normalized_delta", "mean": "mean", "variance": "variance",
                       "gamma": "gamma", "beta": "beta"}, DELTA_OUTPUTS,
            "NCX", None, False, NCX_FORMATS, frozenset((t, t) for t in DTYPES), ("gamma", "beta"), False, True),
    SpecRow("openvino", {"src": "input_forward", "diff_dst": "output_delta", "mean": "mean", "variance": "variance",
                         "gamma": "gamma"}, DELTA_OUTPUTS,
            "NXC", None, True, ALL_FORMATS, frozenset({("f32", "f32"), ("f16", "f32"), ("bf16", "f32"), ("bf16", "bf16")}),
            (), False, True),
    SpecRow("onednn", {name: name for name in ("src", "diff_dst", "mean", "variance", "gamma")}, CANONICAL_OUTPUTS,
            "NXC", None, True, ALL_FORMATS, frozenset({("f32", "f32"), ("bf16", "f32"), ("bf16", "bf16"), ("f16", "f32")}),
            (), True, True),
    SpecRow("tensorflow", {"src": "x", "diff_dst": "y_backprop", "mean": "reserve_space_1", "variance": "reserve_space_2",
                           "gamma": "scale", "beta": "offset"},
            {"diff_src": "x_backprop", "diff_gamma": "scale_backprop", "diff_beta": "offset_backprop"},
            "NHWC", 1e-4, True, frozenset({"NHWC", "NCHW"}), frozenset({("f32", "f32"), ("f16", "f32"), ("bf16", "f32")}),
            ("gamma",), False, True),
    SpecRow("pytorch", {"src": "input", "diff_dst": "grad_output", "mean": "save_mean", "variance": "save_invstd",
                        "gamma": "weight", "beta": "bias"},
            {"diff_src": "grad_input", "diff_gamma": "grad_weight", "diff_beta": "grad_bias"},
            "NCX", None, False, ALL_FORMATS,
            frozenset({("f64", "f64"), ("f32", "f32"), ("f16", "f32"), ("bf16", "f32"), ("f16", "f16"), ("bf16", "bf16")}),
            (), False, False),
]
BY_SPEC = pytest.mark.parametrize("row", SPECS, ids=[row.name for row in SPECS])


def op_inputs(shape=(2, 3, 4, 5), src="f32", stats="f32", channels_last: bool = False) -> dict[str, np.ndarray]:
    """Valid inputs (gamma and beta too) of the given dtypes; channels on axis 1, or last."""
    channels = shape[-1] if channels_last else shape[1]
    rng = np.random.default_rng(0)
    data = {name: rng.standard_normal(shape).astype(DTYPES[src]) for name in ("src", "diff_dst")}
    params = {name: np.abs(rng.standard_normal(channels)).astype(DTYPES[stats])
              for name in ("mean", "variance", "gamma", "beta")}
    return data | params


def validate(inputs, spec: str = "generic", data_format: str = "NCHW", invstd: bool = False,
             outputs=("diff_src", "diff_gamma", "diff_beta")) -> str:
    return validate_inputs(inputs, PROFILES[spec], data_format, variance_is_invstd=invstd, outputs=outputs)


def test_the_table_covers_every_profile() -> None:
    assert [row.name for row in SPECS] == list(PROFILES)


@BY_SPEC
def test_each_spec_reads_its_own_input_names(row: SpecRow) -> None:
    arrays = op_inputs()
    bundle = {row.inputs[name]: arrays[name] for name in row.inputs}
    read = inputs_from_bundle(bundle, "bundle", training=True)
    assert set(read.inputs) == set(row.inputs)
    assert all(read.inputs[name] is arrays[name] for name in row.inputs)
    assert read.variance_is_invstd == (row.inputs["variance"] in ("save_invstd", "invstd"))
    assert read.attributes == {} and read.other_mode == ()
    assert all(is_input_key(key) for key in bundle)


@BY_SPEC
def test_each_spec_names_its_outputs(row: SpecRow) -> None:
    for canonical, theirs in row.outputs.items():
        assert canonical_key(theirs, {}) == canonical
        assert not is_input_key(theirs)  # an output name is no input's


@BY_SPEC
def test_each_spec_defaults(row: SpecRow) -> None:
    profile = PROFILES[row.name]

    def as_typed(epsilon: float | None) -> float | None:  # a spec that types epsilon f32 rounds it as the framework does
        return float(np.float32(epsilon)) if epsilon is not None and row.epsilon_is_f32 else epsilon

    assert profile.default_format == row.default_format
    assert resolve_epsilon(None, profile, variance_is_invstd=False) == as_typed(row.default_epsilon)
    # A variance given as 1/sqrt(var + eps) needs no epsilon: 1.0 stands in (unused) unless the spec has one.
    assert resolve_epsilon(None, profile, variance_is_invstd=True) == as_typed(row.default_epsilon or 1.0)
    assert resolve_epsilon(0.1, profile, variance_is_invstd=False) == as_typed(0.1)
    assert (as_typed(0.1) != 0.1) == row.epsilon_is_f32  # 0.1 is no float32: the rounding shows
    inputs = op_inputs(channels_last=row.default_format in ("NXC", "NHWC"))
    expected = "NCX" if row.default_format in NCX_FORMATS else "NXC"
    assert validate(inputs, row.name, row.default_format) == expected


@BY_SPEC
@pytest.mark.parametrize("alias", sorted(FORMAT_ALIASES))
def test_each_spec_allows_its_layouts(row: SpecRow, alias: str) -> None:
    rank = FORMAT_ALIASES[alias][1] or 4
    channels_last = FORMAT_ALIASES[alias][0] == "NXC"
    inputs = op_inputs((2, 3, 4, 5, 6)[:rank], channels_last=channels_last)
    if alias in row.formats:
        assert validate(inputs, row.name, alias) == FORMAT_ALIASES[alias][0]
        assert validate(inputs, row.name, alias.lower()) == FORMAT_ALIASES[alias][0]  # names are case-blind
    else:
        with pytest.raises(InputError, match=f"^data_format {alias} is not allowed by spec {row.name} "):
            validate(inputs, row.name, alias)


@BY_SPEC
@pytest.mark.parametrize("pair", sorted(ALL_PAIRS), ids="/".join)
def test_each_spec_allows_its_dtype_pairs(row: SpecRow, pair: tuple[str, str]) -> None:
    inputs = op_inputs(src=pair[0], stats=pair[1])
    if pair in row.type_pairs:
        assert validate(inputs, row.name) == "NCX"
    else:
        with pytest.raises(InputError, match=f"^spec {row.name} does not allow src {pair[0]} with mean/variance {pair[1]} "):
            validate(inputs, row.name)


@BY_SPEC
def test_each_spec_holds_gamma_and_beta_to_means_dtype_or_not(row: SpecRow) -> None:
    inputs = op_inputs(src="f32", stats="f32") | {"gamma": np.ones(3, np.float64), "beta": np.zeros(3, np.float64)}
    if row.same_param_dtypes:
        with pytest.raises(InputError, match=f"^gamma has dtype f64, expected f32 = dtype of mean \\(spec {row.name}\\)$"):
            validate(inputs, row.name)
    else:
        assert validate(inputs, row.name) == "NCX"
    inputs["variance"] = inputs["variance"].astype(np.float64)  # variance is mean's dtype in every spec
    with pytest.raises(InputError, match="^variance has dtype f64, expected f32 = dtype of mean"):
        validate(inputs, row.name)


@BY_SPEC
@pytest.mark.parametrize("optional", ["gamma", "beta"])
def test_each_spec_requires_its_inputs(row: SpecRow, optional: str) -> None:
    inputs = op_inputs()
    del inputs[optional]
    if optional in row.required:
        with pytest.raises(InputError, match=f"^missing input {optional} \\(spec {row.name}\\)"):
            validate(inputs, row.name)
    else:
        assert validate(inputs, row.name) == "NCX"


@BY_SPEC
@pytest.mark.parametrize("outputs", [("diff_src",), ("diff_src", "diff_gamma"), ("diff_beta",),
                                     ("diff_gamma", "diff_beta")], ids=["src", "src+gamma", "beta", "gamma+beta"])
def test_each_spec_pairs_the_parameter_gradients_or_not(row: SpecRow, outputs: tuple[str, ...]) -> None:
    one_of_two = ("diff_gamma" in outputs) != ("diff_beta" in outputs)
    if row.paired_param_grads and one_of_two:
        with pytest.raises(InputError, match="^spec onednn produces diff_gamma and diff_beta both or neither"):
            validate(op_inputs(), row.name, outputs=outputs)
    else:
        assert validate(op_inputs(), row.name, outputs=outputs) == "NCX"


# ---------------------------------------------------------------- inputs that do not fit: one message each

def _change(**changes):
    inputs = op_inputs()
    for name, value in changes.items():
        if value is None:
            del inputs[name]
        else:
            inputs[name] = value(inputs) if callable(value) else value
    return inputs


INVALID = [  # id, inputs, data_format, variance_is_invstd, the message
    ("missing-src", _change(src=None), "NCHW", False, r"missing input src \(spec generic\)"),
    ("missing-variance", _change(variance=None), "NCHW", False, r"missing input variance \(spec generic\)"),
    ("int-src", _change(src=lambda a: a["src"].astype(np.int32)), "NCHW", False,
     r"src has dtype int32, expected a float type \(f16, bf16, f32, f64\)"),
    ("bool-gamma", _change(gamma=np.ones(3, bool)), "NCHW", False, r"gamma has dtype bool, expected a float type"),
    ("rank-1-src", _change(src=np.ones(3, np.float32), diff_dst=np.ones(3, np.float32)), "NCX", False,
     r"src has rank 1 \(shape \(3,\)\), expected rank >= 2"),
    ("rank-fixed-by-alias", op_inputs(), "NCW", False, r"data_format NCW needs a rank-3 src, found rank 4"),
    ("unknown-format", op_inputs(), "NQHW", False, r"data_format NQHW is not allowed by spec generic"),
    ("diff-dst-shape", _change(diff_dst=lambda a: a["diff_dst"][:1]), "NCHW", False,
     r"diff_dst has shape \(1, 3, 4, 5\), expected \(2, 3, 4, 5\) = shape of src"),
    ("diff-dst-dtype", _change(diff_dst=lambda a: a["diff_dst"].astype(np.float64)), "NCHW", False,
     r"diff_dst has dtype f64, expected f32 = dtype of src"),
    ("mean-length", _change(mean=lambda a: a["mean"][:2]), "NCHW", False,
     r"mean has shape \(2,\), expected \(3,\) = C of src \(NCX\)$"),
    ("gamma-fits-other-layout", _change(gamma=np.ones(5, np.float32)), "NCHW", False,
     r"gamma has shape \(5,\), expected \(3,\) = C of src \(NCX\); with --format NHWC it fits "
     r"\(C = 5 on axis 3 of src \(2, 3, 4, 5\)\)$"),
    ("variance-negative", _change(variance=np.array([1.0, -0.5, -1.0], np.float32)), "NCHW", False,
     r"variance at c=1 is -0\.5, expected >= 0 \(2 channels bad; use --variance-is-invstd"),
    ("variance-nan", _change(variance=np.array([1.0, 1.0, np.nan], np.float32)), "NCHW", False,
     r"variance at c=2 is nan, expected >= 0 \(1 channels bad"),
    ("variance-zero-is-fine-but-not-as-invstd", _change(variance=np.array([0.0, 1.0, 1.0], np.float32)), "NCHW", True,
     r"variance \(as invstd\) at c=0 is 0\.0, expected finite > 0 \(1 channels bad\)"),
    ("invstd-inf", _change(variance=np.array([1.0, np.inf, 1.0], np.float32)), "NCHW", True,
     r"variance \(as invstd\) at c=1 is inf"),
]


@pytest.mark.parametrize("inputs, data_format, invstd, message", [row[1:] for row in INVALID],
                         ids=[row[0] for row in INVALID])
def test_inputs_that_do_not_fit_are_one_message(inputs, data_format: str, invstd: bool, message: str) -> None:
    with pytest.raises(InputError) as raised:
        validate(inputs, "generic", data_format, invstd)
    assert re.match(message, str(raised.value)), str(raised.value)
    assert "\n" not in str(raised.value)


def test_zero_variance_is_valid_and_so_are_empty_dimensions() -> None:
    assert validate(_change(variance=np.zeros(3, np.float32))) == "NCX"
    empty = op_inputs((0, 3, 4, 5))
    assert validate(empty) == "NCX"
    assert validate(op_inputs((2, 0, 4, 5))) == "NCX"


# ---------------------------------------------------------------- bundle attributes and keys

ATTRIBUTES = [  # id, the bundle's entries, what read_attributes gives or the message it raises
    ("epsilon-float", {"epsilon": np.array(1e-3)}, {"epsilon": 1e-3}),
    ("epsilon-int", {"epsilon": np.array(1, np.int64)}, {"epsilon": 1.0}),
    ("epsilon-float32", {"epsilon": np.float32(1e-5)}, {"epsilon": float(np.float32(1e-5))}),
    ("format-str", {"data_format": np.array("NHWC")}, {"data_format": "NHWC"}),
    ("format-bytes", {"data_format": np.array(b"NCHW")}, {"data_format": "NCHW"}),
    ("training-bool", {"is_training": np.array(False)}, {"is_training": False}),
    ("training-int", {"is_training": np.array(1)}, {"is_training": True}),
    ("all-three", {"epsilon": np.array(1e-5), "data_format": np.array("NCX"), "is_training": np.array(True)},
     {"epsilon": 1e-5, "data_format": "NCX", "is_training": True}),
    ("inputs-left-alone", {"src": np.ones((2, 3))}, {}),
    ("epsilon-not-0d", {"epsilon": np.array([1e-3, 1e-3])}, r"b: 'epsilon' must be a 0-d entry, found shape \(2,\)$"),
    ("epsilon-string", {"epsilon": np.array("1e-3")}, r"b: 'epsilon' must be a real number, found dtype <U4$"),
    ("epsilon-complex", {"epsilon": np.array(1j)}, r"b: 'epsilon' must be a real number, found dtype complex128$"),
    ("training-two", {"is_training": np.array(2)}, r"b: 'is_training' must be a boolean \(or 0/1\), found 2 \(int64\)$"),
    ("training-float", {"is_training": np.array(1.0)}, r"b: 'is_training' must be a boolean \(or 0/1\), found 1\.0"),
    ("format-number", {"data_format": np.array(4)}, r"b: 'data_format' must be a string, found dtype int64$"),
    ("format-empty", {"data_format": np.array("")}, r"b: 'data_format' is empty; expected NCX, NXC or an alias"),
    ("format-blank", {"data_format": np.array("   ")}, r"b: 'data_format' is empty"),
]


@pytest.mark.parametrize("entries, expected", [row[1:] for row in ATTRIBUTES], ids=[row[0] for row in ATTRIBUTES])
def test_bundle_attributes(entries: dict, expected) -> None:
    if isinstance(expected, dict):
        assert read_attributes(entries, "b") == expected
    else:
        with pytest.raises(InputError) as raised:
            read_attributes(entries, "b")
        assert re.match(expected, str(raised.value)), str(raised.value)


KEYS = [  # key, training, the input it names (None: none)
    ("src", True, "src"), ("x", True, "src"), ("input", True, "src"), ("input_forward", False, "src"),
    ("y_backprop", True, "diff_dst"), ("grad_output", True, "diff_dst"), ("normalized_delta", True, "diff_dst"),
    ("reserve_space_1", True, "mean"), ("reserve_space_2", True, "variance"), ("invstd", True, "variance"),
    ("scale", True, "gamma"), ("weight", True, "gamma"), ("offset", True, "beta"), ("bias", True, "beta"),
    ("save_mean", True, "mean"), ("save_mean", False, None), ("save_invstd", True, "variance"),
    ("running_mean", False, "mean"), ("running_mean", True, None), ("running_var", False, "variance"),
    ("running_var", None, "variance"), ("save_mean", None, "mean"),
    ("dy", True, None), ("Src", True, None), ("x_backprop", True, None), ("epsilon", True, None),
]


@pytest.mark.parametrize("key, training, name", KEYS, ids=[f"{k}-{t}" for k, t, _ in KEYS])
def test_input_names_by_key_and_mode(key: str, training: bool | None, name: str | None) -> None:
    assert canonical_input_name(key, training) == name


def test_two_keys_for_one_input_and_the_other_modes_statistics() -> None:
    arrays = op_inputs()
    with pytest.raises(InputError, match=r"^b: both 'src' and 'x' give src; keep one$"):
        inputs_from_bundle({"src": arrays["src"], "x": arrays["src"]}, "b")
    read = inputs_from_bundle({"save_mean": arrays["mean"], "running_mean": arrays["mean"], "epsilon": np.array(1e-5),
                               "reserve_space_3": np.ones(1)}, "b", training=True)
    assert set(read.inputs) == {"mean"} and read.other_mode == ("running_mean",)
    assert read.attributes == {"epsilon": 1e-5}


@pytest.mark.parametrize("key, known", [("src", True), ("epsilon", True), ("reserve_space_3", True),
                                        ("running_var", True), ("junk", False), ("diff_src", False)])
def test_bundle_keys_are_vetted_by_name(key: str, known: bool) -> None:
    if known:
        check_bundle_keys([key], "b")
    else:
        with pytest.raises(InputError, match=f"^b: unknown key '{key}'; expected one of src, diff_dst, "):
            check_bundle_keys([key], "b")


@pytest.mark.parametrize("key, gamma_like", [("weight", True), ("bn1.weight", True), ("gamma_0", True),
                                             ("Scale", True), ("layer2.bn.scale3", True), ("weights", False),
                                             ("bias", False), ("scale_backprop", False), ("", False)])
def test_keys_named_like_gamma(key: str, gamma_like: bool) -> None:
    assert looks_like_gamma(key) == gamma_like


@pytest.mark.parametrize("name, candidates, shape, expected", [
    ("diff_dst", {"dy": (2, 3), "z": (3,)}, (2, 3), "dy"),  # the one key of the wanted shape
    ("mean", {"mu": (3,), "sigma2": (3,)}, (3,), "mu"),  # two fit: the closer name
    ("mean", {"foo": (3,), "bar": (3,)}, (3,), None),  # two fit, neither by name
    ("variance", {"var": None}, None, "var"),  # shapes unknown: by name alone
    ("gamma", {"zzz": None}, None, None),
])
def test_a_missing_inputs_suggested_key(name: str, candidates: dict, shape, expected) -> None:
    assert suggest_key(name, candidates, shape) == expected


@pytest.mark.parametrize("epsilon, spec, expected", [
    (1e-5, "generic", 1e-5), (1e-5, "openvino", float(np.float32(1e-5))), (1e39, "generic", 1e39),
    (0.0, "generic", r"epsilon is 0\.0, expected a finite number > 0"),
    (-1e-5, "generic", r"epsilon is -1e-05, expected a finite number > 0"),
    (float("nan"), "generic", r"epsilon is nan"), (float("inf"), "onednn", r"epsilon is inf"),
    (1e39, "openvino", r"epsilon 1e\+39 is inf as float32 \(spec openvino types it f32\)"),
    (1e-50, "onednn", r"epsilon 1e-50 is 0 as float32 \(spec onednn types it f32\)"),
])
def test_epsilon_checks(epsilon: float, spec: str, expected) -> None:
    if isinstance(expected, float):
        assert check_epsilon(epsilon, PROFILES[spec]) == expected
    else:
        with pytest.raises(InputError) as raised:
            check_epsilon(epsilon, PROFILES[spec])
        assert re.match(expected, str(raised.value)), str(raised.value)
