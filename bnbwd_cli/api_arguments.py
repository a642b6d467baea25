"""The Python API's arguments, checked and converted: what a caller holds (NumPy, torch, JAX, TensorFlow arrays,
lists) as host NumPy arrays, the inputs by any of the CLI's names as a checked Op (app/inputs.py, the one way in),
and every option of the wrong kind an InputError with the CLI's words, never a TypeError from deep inside.

A face's helper, beside api.py (which holds the functions and their Report); no framework is imported: a torch
tensor is recognised by its type's module (torch is then loaded already).
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bnbwd_cli.app.inputs import Naming, OpSettings, SplitRequest, split_arrays
from bnbwd_cli.errors import InputError
from bnbwd_cli.files.common import short_repr
from bnbwd_cli.op import Op
from bnbwd_cli.spec import ATTRIBUTE_KEYS, OUTPUT_NAMES, PROFILES, is_input_key


def as_array(name: str, value: Any) -> np.ndarray:
    """What a caller holds, as a NumPy array on the host, never a copy it would see changed and never imported
    frameworks: a torch tensor (detached, copied from a GPU, bfloat16 kept as bfloat16 through its bits), anything
    with __array__ (NumPy, JAX, TensorFlow), anything with __dlpack__, or what np.asarray takes (lists)."""
    try:
        if type(value).__module__.split(".")[0] == "torch" and "torch" in sys.modules:
            return from_torch(value)
        if hasattr(value, "__array__") or not hasattr(value, "__dlpack__"):
            return np.asarray(value)
        return np.from_dlpack(value)
    except (TypeError, ValueError, RuntimeError, BufferError, AttributeError) as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(f"{name}: not an array ({type(value).__name__}: {detail})") from None


def from_torch(tensor: Any) -> np.ndarray:
    """A torch tensor on the host, its values as they are: requires_grad and device (a GPU's is copied) do not
    matter, non-contiguous strides are kept, bfloat16 comes as its 16-bit patterns viewed as bfloat16."""
    torch = sys.modules["torch"]
    if not isinstance(tensor, torch.Tensor):
        return np.asarray(tensor)
    host = tensor.detach().to("cpu").resolve_conj().resolve_neg()
    if host.dtype == torch.bfloat16:
        from bnbwd_cli.dtypes import BFLOAT16

        return host.contiguous().view(torch.int16).numpy().view(BFLOAT16)
    return host.numpy()


def kernel_outputs(actual: Any) -> dict[str, np.ndarray]:
    """A mapping of names to arrays, or a sequence (tuple, list, named tuple) in (diff_src, diff_gamma, diff_beta)
    order (None: not produced), as autograd and native_batch_norm_backward return them."""
    if isinstance(actual, Mapping):
        return {str(key): as_array(str(key), value) for key, value in actual.items() if value is not None}
    if isinstance(actual, (tuple, list)):
        if not 1 <= len(actual) <= len(OUTPUT_NAMES):
            raise InputError(f"actual is a {type(actual).__name__} of {len(actual)}, expected 1 to 3 arrays in the "
                             f"order {', '.join(OUTPUT_NAMES)}")
        return {name: as_array(name, value) for name, value in zip(OUTPUT_NAMES, actual) if value is not None}
    raise InputError(f"actual is a {type(actual).__name__}, expected a mapping of output names to arrays or a "
                     f"sequence in the order {', '.join(OUTPUT_NAMES)}")


@dataclass(frozen=True)
class Call:
    """One call's inputs as the caller named them (canonical names, a spec's or PyTorch's) and its settings."""

    arrays: Mapping[str, Any]
    op: OpSettings
    key_map: Mapping[str, str]


def checked_op(call: Call) -> Op:
    """Array-likes by any of the CLI's names -> checked Op (app/inputs.py, as every command checks them); arguments
    of the wrong kind are InputErrors too, never a TypeError or AttributeError from deep inside."""
    op = call.op
    if op.epsilon is not None and not _finite_real(op.epsilon):
        raise InputError(f"epsilon is {short_repr(op.epsilon)}, expected a finite number > 0")
    if op.data_format is None:
        raise InputError("data_format is required: NCHW (or NCX) for PyTorch tensors, channels_last ones too; "
                         "NHWC (or NXC) for TensorFlow's default")
    if not isinstance(op.data_format, str):
        raise InputError(f"data_format is {short_repr(op.data_format)}, expected a layout name such as NCHW or NHWC")
    if not isinstance(op.spec, str) or op.spec not in PROFILES:
        raise InputError(f"spec is {short_repr(op.spec)}, expected one of {', '.join(PROFILES)}")
    arrays = {name: value for name, value in call.arrays.items() if value is not None}
    for name in arrays:
        if not is_input_key(call.key_map.get(name, name)) or name in ATTRIBUTE_KEYS:
            raise InputError(f"{name}: not an input name; expected src, diff_dst, mean, variance, gamma, beta, a "
                             "spec's or PyTorch's name for one (x, grad_output, weight, save_mean, save_invstd, ...), "
                             "or one key_map names")
    naming = Naming(dict(call.key_map))
    split = split_arrays({name: as_array(name, value) for name, value in arrays.items()},
                         SplitRequest(naming, op), "inputs")
    return split.build_op()


def op_settings(epsilon: Any, data_format: Any, spec: Any, training: Any, variance_is_invstd: Any) -> OpSettings:
    return OpSettings(epsilon, data_format, spec, flag("training", training), flag("variance_is_invstd", variance_is_invstd))


def flag(name: str, value: Any) -> bool:
    """True or False (NumPy's too, or 0 and 1), never the truth of a string or an array."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Integral) and value in (0, 1)):
        return bool(value)
    raise InputError(f"{name} is {short_repr(value)}, expected True or False")


def max_units_of(value: Any) -> float | None:
    """K as the CLI's --max-units takes it: a finite number >= 0."""
    if value is None:
        return None
    if not _finite_real(value) or value < 0:
        raise InputError(f"max_units is {short_repr(value)}, expected a finite number >= 0")
    return float(value)


def _finite_real(value: Any) -> bool:
    """A real number (NumPy's too, not a bool, a string or an array) that is a finite float (10**400 is not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def key_map_of(key_map: Any) -> dict[str, str]:
    """{THEIRS: OURS}, names as strings."""
    if key_map is None:
        return {}
    if not isinstance(key_map, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in key_map.items()):
        raise InputError(f"key_map is {short_repr(key_map)}, expected a mapping of names to names ({{'dx': 'diff_src'}})")
    return dict(key_map)


def only_of(only: Any) -> tuple[str, ...]:
    """The outputs to judge, as the CLI's --only takes them: a name, names joined by commas, or a sequence of names
    (None: every one)."""
    if only is None:
        return ()
    names = tuple(name.strip() for name in only.split(",") if name.strip()) if isinstance(only, str) else only
    if not isinstance(names, (tuple, list)) or not names or not all(isinstance(name, str) for name in names):
        raise InputError(f"only is {short_repr(only)}, expected an output's name or a sequence of them "
                         "(('diff_src', 'diff_beta'))")
    return tuple(names)


def choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value.lower() not in options:
        raise InputError(f"{name} is {short_repr(value)}, expected one of {', '.join(options)}")
    return value.lower()


def text_of(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InputError(f"{name} is {short_repr(value)}, expected a layout name such as NCX, NXC, NCHW or NHWC")
    return value.upper()


def count_of(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise InputError(f"{name} is {short_repr(value)}, expected an integer >= 0")
    return int(value)
