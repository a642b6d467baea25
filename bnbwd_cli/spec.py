"""What each spec allows: input names and aliases, defaults, dtype rules; and input validation.

Pure: raises InputError with one precise line; knows nothing of files or terminals.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from bnbwd_cli.errors import InputError
from bnbwd_cli.layout import FORMAT_ALIASES, channel_axis, other_format, resolve_format
from bnbwd_cli.dtypes import dtype_label
from bnbwd_cli.dtypes import dtype_name as float_name  # None for dtypes that are not floats

INPUT_NAMES = ("src", "diff_dst", "mean", "variance", "gamma", "beta")
OUTPUT_NAMES = ("diff_src", "diff_gamma", "diff_beta")
PARAM_NAMES = ("mean", "variance", "gamma", "beta")  # the (C,) inputs, dtype T2

# canonical name -> names the four specs and PyTorch use for it (nGraph, OpenVINO, oneDNN, TensorFlow, PyTorch)
ALIASES: dict[str, tuple[str, ...]] = {
    "src": ("input", "input_forward", "x"),
    "diff_dst": ("normalized_delta", "output_delta", "y_backprop", "grad_output"),
    "mean": ("reserve_space_1",),
    "variance": ("reserve_space_2", "invstd"),
    "gamma": ("scale", "weight"),
    "beta": ("offset", "bias"),
}
# PyTorch's statistics (native_batch_norm_backward) depend on the mode: the batch's own (save_*) in training,
# the running ones in inference; the other mode's are left unused. save_invstd and invstd hold 1/sqrt(var + eps).
MODE_STATISTICS: dict[bool, dict[str, str]] = {  # training? -> {key: canonical name}
    True: {"save_mean": "mean", "save_invstd": "variance"},
    False: {"running_mean": "mean", "running_var": "variance"},
}
INVSTD_KEYS = ("save_invstd", "invstd")
# Names only channels-first frameworks use (PyTorch's native_batch_norm_backward, nGraph's input): a bundle that
# names its tensors so, and says no layout, is logically NCX whatever the spec's default (a channels_last tensor
# is still logically NCHW).
CHANNELS_FIRST_KEYS = ("input", "grad_output", "save_mean", "save_invstd", "running_mean", "running_var")
# Bundle entries that are not tensors of the op: attributes, and TF's unused reserve_space_3.
ATTRIBUTE_KEYS = ("epsilon", "data_format", "is_training")
IGNORED_KEYS = ("reserve_space_3",)
# Names people give the tensors in their own dumps: never read as such, only suggested (--map THEIRS=OURS).
COMMON_NAMES: dict[str, tuple[str, ...]] = {
    "src": ("inp", "x_in", "activation"), "diff_dst": ("dy", "dout", "grad_out", "grad_y", "gy", "d_out"),
    "mean": ("mu", "batch_mean"), "variance": ("var", "batch_var", "sigma2"), "gamma": ("w", "g"),
    "diff_src": ("dx", "grad_x", "gx", "din"), "diff_gamma": ("dgamma", "dw", "grad_w", "dscale"),
    "diff_beta": ("dbeta", "db", "grad_b", "dbias"),
}
# A key by one of these names that no input takes is an error, not a note: an unread gamma means gamma = 1.
GAMMA_LIKE = ("weight", "scale", "gamma")

# Float dtypes by short name (float_name, None for other dtypes): naming bfloat16 needs no ml_dtypes at import.
FLOAT_NAMES = ("f16", "bf16", "f32", "f64")
F16, BF16, F32, F64 = FLOAT_NAMES


@dataclass(frozen=True, kw_only=True)
class SpecProfile:
    """One spec's defaults and restrictions."""

    name: str
    default_format: str
    default_epsilon: float | None  # None: --epsilon is required
    formats: tuple[str, ...]  # format names (aliases allowed) this spec accepts
    type_pairs: tuple[tuple[str, str], ...] | None  # allowed (T1, T2) by short name; None = any float pair
    same_param_dtypes: bool  # mean/variance/gamma/beta all T2
    required: tuple[str, ...]  # optional inputs this spec requires
    epsilon_is_f32: bool  # the spec types epsilon as f32: round it like the framework does
    paired_param_grads: bool  # oneDNN: diff_gamma and diff_beta both or neither

    def allows_types(self, t1: np.dtype, t2: np.dtype) -> bool:
        return self.type_pairs is None or (float_name(t1), float_name(t2)) in self.type_pairs

    def describe_types(self) -> str:
        if self.type_pairs is None:
            return "any of f16/bf16/f32/f64 for each"
        return ", ".join(f"{a}/{b}" for a, b in self.type_pairs)


ANY_FORMAT = tuple(FORMAT_ALIASES)
NCX_FORMATS = ("NCX", "NC", "NCW", "NCHW", "NCDHW")
PROFILES: dict[str, SpecProfile] = {
    p.name: p
    for p in (
        # Any float combination the math allows.
        SpecProfile(name="generic", default_format="NXC", default_epsilon=None, formats=ANY_FORMAT,
                    type_pairs=None, same_param_dtypes=False, required=(),
                    epsilon_is_f32=False, paired_param_grads=False),
        # nGraph BatchNormTrainingBackprop: NCX, gamma and beta required, one element type.
        SpecProfile(name="ngraph", default_format="NCX", default_epsilon=None, formats=NCX_FORMATS,
                    type_pairs=tuple((t, t) for t in FLOAT_NAMES), same_param_dtypes=True,
                    required=("gamma", "beta"), epsilon_is_f32=False, paired_param_grads=False),
        # OpenVINO BatchNormTrainingBackprop-1.
        SpecProfile(name="openvino", default_format="NXC", default_epsilon=None, formats=ANY_FORMAT,
                    type_pairs=((F32, F32), (F16, F32), (BF16, F32), (BF16, BF16)), same_param_dtypes=True,
                    required=(), epsilon_is_f32=True, paired_param_grads=False),
        # oneDNN Graph BatchNormTrainingBackward: diff_gamma and diff_beta both or neither.
        SpecProfile(name="onednn", default_format="NXC", default_epsilon=None, formats=ANY_FORMAT,
                    type_pairs=((F32, F32), (BF16, F32), (BF16, BF16), (F16, F32)), same_param_dtypes=True,
                    required=(), epsilon_is_f32=True, paired_param_grads=True),
        # TensorFlow FusedBatchNormGradV3: 4-D NHWC/NCHW, f32 stats, epsilon 1e-4 by default.
        SpecProfile(name="tensorflow", default_format="NHWC", default_epsilon=1e-4, formats=("NHWC", "NCHW"),
                    type_pairs=((F32, F32), (F16, F32), (BF16, F32)), same_param_dtypes=True,
                    required=("gamma",), epsilon_is_f32=True, paired_param_grads=False),
        # PyTorch native_batch_norm_backward: tensors are logically channels-first (channels_last is a memory
        # format); reduced-precision inputs keep f32 statistics on GPUs, their own dtype on CPU.
        SpecProfile(name="pytorch", default_format="NCX", default_epsilon=None, formats=ANY_FORMAT,
                    type_pairs=((F64, F64), (F32, F32), (F16, F32), (BF16, F32), (F16, F16), (BF16, BF16)),
                    same_param_dtypes=False, required=(), epsilon_is_f32=False, paired_param_grads=False),
    )
}


def canonical_input_name(key: str, training: bool | None = None) -> str | None:
    """'y_backprop' -> 'diff_dst'; 'save_mean' -> 'mean' in training (None in inference: unused); None for a key
    that names no input. training None: any mode's statistics count (is the key an input at all?)."""
    for name, aliases in ALIASES.items():
        if key == name or key in aliases:
            return name
    for mode, names in MODE_STATISTICS.items():
        if key in names and training in (None, mode):
            return names[key]
    return None


@dataclass(frozen=True)
class BundleInputs:
    """A bundle's inputs by canonical name, its attributes, whether the variance came as an invstd (PyTorch's
    save_invstd), and the keys that are inputs only in the other mode (PyTorch's other statistics)."""

    inputs: dict[str, np.ndarray]
    attributes: dict[str, object]
    variance_is_invstd: bool
    other_mode: tuple[str, ...]


def read_attributes(bundle: dict[str, np.ndarray], label: str) -> dict[str, object]:
    """The bundle's 0-d epsilon, data_format and is_training entries, checked."""
    return {key: _attribute(key, array, label) for key, array in bundle.items() if key in ATTRIBUTE_KEYS}


def inputs_from_bundle(bundle: dict[str, np.ndarray], label: str, training: bool = True) -> BundleInputs:
    """Split a bundle into inputs by canonical name and attributes (epsilon, data_format, is_training); the mode
    picks PyTorch's statistics."""
    inputs: dict[str, np.ndarray] = {}
    seen_as: dict[str, str] = {}
    other_mode: list[str] = []
    for key, array in bundle.items():
        if key in ATTRIBUTE_KEYS or key in IGNORED_KEYS:
            continue
        name = canonical_input_name(key, training)
        if name is None:
            check_bundle_keys([key], label)
            other_mode.append(key)
            continue
        if name in inputs:
            raise InputError(f"{label}: both {seen_as[name]!r} and {key!r} give {name}; keep one")
        inputs[name], seen_as[name] = array, key
    invstd = seen_as.get("variance") in INVSTD_KEYS
    return BundleInputs(inputs, read_attributes(bundle, label), invstd, tuple(other_mode))


def is_input_key(key: str) -> bool:
    """Whether a key names an input (by any spec's name, in either mode), an attribute or TF's unused reserve_space_3."""
    return key in ATTRIBUTE_KEYS or key in IGNORED_KEYS or canonical_input_name(key) is not None


def _input_names() -> list[str]:
    return [*INPUT_NAMES, *(a for v in ALIASES.values() for a in v), *(k for v in MODE_STATISTICS.values() for k in v)]


def input_keys() -> frozenset[str]:
    """Every key that may hold an input or an attribute (canonical names, the specs' aliases, attributes)."""
    return frozenset([*_input_names(), *ATTRIBUTE_KEYS, *IGNORED_KEYS])


def check_bundle_keys(keys: list[str], label: str) -> None:
    """Refuse a bundle key that is neither an input (by any spec's name) nor an attribute: from the names
    alone, before any member is inflated."""
    for key in keys:
        if not is_input_key(key):
            known = ", ".join([*_input_names(), *ATTRIBUTE_KEYS])
            raise InputError(f"{label}: unknown key {key!r}; expected one of {known}")


def looks_like_gamma(key: str) -> bool:
    """'weight', 'bn1.weight', 'gamma_0', 'Scale': a key named like gamma (its last word, digits aside)."""
    words = [w for w in re.split(r"[^a-z0-9]+|(?<=[a-z])(?=[0-9])|(?<=[0-9])(?=[a-z])", key.lower()) if w and not w.isdigit()]
    return bool(words) and words[-1] in GAMMA_LIKE


class ShapesOnDemand(Mapping):
    """Keys and their arrays' shapes (None: in no array set), each shape looked up only when asked: only a missing
    key's suggested --map asks, so a file member nothing uses is never inflated on the way to a verdict."""

    def __init__(self, sides: Sequence[Mapping[str, np.ndarray]], keys: Iterable[str]) -> None:
        self._sides, self._keys = sides, list(dict.fromkeys(keys))

    def __getitem__(self, key: str) -> tuple[int, ...] | None:
        if key not in self._keys:
            raise KeyError(key)
        return next((tuple(side[key].shape) for side in self._sides if key in side), None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def suggest_key(name: str, candidates: Mapping[str, tuple[int, ...] | None], shape: tuple[int, ...] | None) -> str | None:
    """The key most likely to hold `name`: among the candidates (key -> shape, None when unknown) of the wanted
    shape (when known), the one whose name is closest to `name` or one of its aliases; None when nothing fits."""
    import difflib  # only when an input is missing

    names = [name, *ALIASES.get(name, ()), *COMMON_NAMES.get(name, ()),
             *(k for v in MODE_STATISTICS.values() for k, n in v.items() if n == name)]
    fitting = [key for key, s in candidates.items() if shape is None or s is None or tuple(s) == tuple(shape)]
    by_shape = [key for key in fitting if shape is not None and candidates[key] is not None]

    def closeness(key: str) -> float:
        return max(difflib.SequenceMatcher(None, key.lower(), n).ratio() for n in names)

    ranked = sorted(by_shape or fitting, key=closeness, reverse=True)
    if len(by_shape) == 1:
        return by_shape[0]
    return ranked[0] if ranked and closeness(ranked[0]) >= 0.8 else None


# A bundle's string entries are names (NCHW, True): longer ones are refused from their dtype, before they are read
# (a 1 MiB data_format arrives unread, as a large input does, and was exit 4).
ATTRIBUTE_TEXT_MAX = 64


def _attribute(key: str, array: np.ndarray, label: str) -> object:
    if array.ndim != 0:
        raise InputError(f"{label}: {key!r} must be a 0-d entry, found shape {array.shape}")
    characters = array.dtype.itemsize // (4 if array.dtype.kind == "U" else 1) if array.dtype.kind in "US" else 0
    if characters > ATTRIBUTE_TEXT_MAX:
        raise InputError(f"{label}: {key!r} is a string of up to {characters} characters (dtype {array.dtype}); "
                         "expected a short entry (NCHW, True, ...)")
    if hasattr(array, "read"):  # a stand-in known by its header (files.npy.Declared): read it now
        array = array.read()
    if key == "epsilon":
        if array.dtype.kind not in "fiu":
            raise InputError(f"{label}: 'epsilon' must be a real number, found dtype {array.dtype}")
        return float(array)
    if key == "is_training":
        if array.dtype.kind not in "biu" or array.item() not in (0, 1):
            raise InputError(f"{label}: 'is_training' must be a boolean (or 0/1), found {array.item()!r} ({array.dtype})")
        return bool(array.item())
    if array.dtype.kind not in "US":
        raise InputError(f"{label}: 'data_format' must be a string, found dtype {array.dtype}")
    value = array.item()
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    if not text.strip():
        raise InputError(f"{label}: 'data_format' is empty; expected NCX, NXC or an alias (e.g. NCHW), or leave the entry out")
    return text


def resolve_epsilon(epsilon: float | None, profile: SpecProfile, variance_is_invstd: bool) -> float | None:
    """The epsilon to use: the given one (flag or file entry), else the spec's default, checked; 1.0 (unused)
    when the variance already is 1/sqrt(var + eps). None when one is needed and none is given: the caller
    says which flag or entry is missing."""
    if epsilon is None:
        epsilon = profile.default_epsilon
    if epsilon is None:
        return 1.0 if variance_is_invstd else None
    return check_epsilon(epsilon, profile)


def check_epsilon(epsilon: float, profile: SpecProfile) -> float:
    """Epsilon > 0 and finite; rounded to float32 where the spec types it f32 (as the frameworks store it)."""
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise InputError(f"epsilon is {epsilon!r}, expected a finite number > 0")
    if not profile.epsilon_is_f32:
        return float(epsilon)
    with np.errstate(over="ignore", under="ignore"):
        rounded = float(np.float32(epsilon))
    if not math.isfinite(rounded) or rounded <= 0:
        raise InputError(f"epsilon {epsilon:g} is {rounded:g} as float32 (spec {profile.name} types it f32); "
                         "use a value float32 can hold")
    return rounded


def validate_inputs(
    inputs: dict[str, np.ndarray],
    profile: SpecProfile,
    data_format: str,
    *,
    variance_is_invstd: bool,
    outputs: tuple[str, ...],
) -> str:
    """Check names, ranks, shapes and dtypes against the profile. Returns the canonical format."""
    for name in ("src", "diff_dst", "mean", "variance", *profile.required):
        if name not in inputs:
            raise InputError(f"missing input {name} (spec {profile.name}): no array named {name!r} or a spec's name for it",
                             hint=f"--map THEIRS={name} reads your own name for it")
    for name, array in inputs.items():
        if float_name(array.dtype) is None:
            raise InputError(f"{name} has dtype {array.dtype}, expected a float type (f16, bf16, f32, f64)")
    src, diff_dst = inputs["src"], inputs["diff_dst"]
    if src.ndim < 2:
        raise InputError(f"src has rank {src.ndim} (shape {src.shape}), expected rank >= 2: (N, C, ...) or (N, ..., C)")
    allowed = {name.upper() for name in profile.formats}
    if data_format.upper() not in allowed:
        raise InputError(f"data_format {data_format} is not allowed by spec {profile.name} (allowed: {', '.join(profile.formats)})")
    canonical = resolve_format(data_format, src.ndim)
    if diff_dst.shape != src.shape:
        raise InputError(f"diff_dst has shape {diff_dst.shape}, expected {src.shape} = shape of src")
    if diff_dst.dtype != src.dtype:
        raise InputError(f"diff_dst has dtype {dtype_label(diff_dst.dtype)}, expected {dtype_label(src.dtype)} = dtype of src")
    channels = src.shape[channel_axis(canonical, src.ndim)]
    for name in PARAM_NAMES:
        if name in inputs and inputs[name].shape != (channels,):
            raise InputError(f"{name} has shape {inputs[name].shape}, expected ({channels},) = C of src ({canonical})"
                             + _layout_suggestion(inputs[name].shape, src.shape, canonical, profile))
    _check_types(inputs, profile)
    _check_variance(inputs["variance"], variance_is_invstd)
    if profile.paired_param_grads and (("diff_gamma" in outputs) != ("diff_beta" in outputs)):
        raise InputError("spec onednn produces diff_gamma and diff_beta both or neither; asked for one")
    return canonical


def _layout_suggestion(param_shape: tuple[int, ...], src_shape: tuple[int, ...], canonical: str,
                       profile: SpecProfile) -> str:
    """'; --format NCHW fits ...' when the other layout's channel axis matches a (C,) input's length."""
    ndim = len(src_shape)
    other = other_format(canonical, ndim)
    axis = channel_axis(other, ndim)
    allowed = {name.upper() for name in profile.formats}
    if ndim < 3 or param_shape != (src_shape[axis],) or other not in allowed:
        return ""
    return f"; with --format {other} it fits (C = {src_shape[axis]} on axis {axis} of src {src_shape})"


def _check_types(inputs: dict[str, np.ndarray], profile: SpecProfile) -> None:
    t1, t2 = inputs["src"].dtype, inputs["mean"].dtype
    params = [name for name in PARAM_NAMES if name in inputs]
    must_match = params if profile.same_param_dtypes else ["variance"]
    for name in must_match:
        if inputs[name].dtype != t2:
            raise InputError(
                f"{name} has dtype {dtype_label(inputs[name].dtype)}, expected {dtype_label(t2)} = dtype of mean "
                f"(spec {profile.name})"
            )
    if not profile.allows_types(t1, t2):
        raise InputError(
            f"spec {profile.name} does not allow src {dtype_label(t1)} with mean/variance {dtype_label(t2)} "
            f"(allowed src/stats: {profile.describe_types()})"
        )


def _check_variance(variance: np.ndarray, variance_is_invstd: bool) -> None:
    values = variance.astype(np.float64) if float_name(variance.dtype) != BF16 else variance.astype(np.float32)
    if variance_is_invstd:
        bad = np.flatnonzero(~(values > 0) | ~np.isfinite(values))
        if bad.size:
            c = int(bad[0])
            raise InputError(f"variance (as invstd) at c={c} is {float(values[c])!r}, expected finite > 0 ({bad.size} channels bad)")
        return
    bad = np.flatnonzero(~(values >= 0))  # catches NaN too
    if bad.size:
        c = int(bad[0])
        raise InputError(
            f"variance at c={c} is {float(values[c])!r}, expected >= 0 ({bad.size} channels bad; "
            "use --variance-is-invstd if it holds 1/sqrt(var+eps))"
        )
