"""The Python API: bnbwd's backward pass and its judgement of a kernel, inside pytest, no subprocess.

The Python face of app/: the same input checks (app/inputs.py), core and judgement (app/judge.py) as
`bnbwd run --reference` and `bnbwd check`; only the way arrays come in (arguments, not files) and the
verdict goes out (a Report, not an exit code) differ. A bad input raises bnbwd_cli.InputError (a
ValueError) with the CLI's one-line message, less its advice on flags.

>>> import numpy as np, bnbwd_cli
>>> rng = np.random.default_rng(0)
>>> src = rng.normal(size=(4, 3, 5, 5)).astype(np.float32)
>>> dy = rng.normal(size=src.shape).astype(np.float32)
>>> mean, var = src.mean(axis=(0, 2, 3)), src.var(axis=(0, 2, 3))
>>> grads = bnbwd_cli.backward(src, dy, mean, var, epsilon=1e-5, data_format="NCHW")
>>> sorted(grads), grads["diff_src"].shape, grads["diff_gamma"].dtype
(['diff_beta', 'diff_gamma', 'diff_src'], (4, 3, 5, 5), dtype('float32'))
>>> bool(bnbwd_cli.check(grads, src=src, diff_dst=dy, mean=mean, variance=var, epsilon=1e-5, data_format="NCHW"))
True
"""

from __future__ import annotations

import io
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console

from bnbwd_cli.app import judge as app_judge
from bnbwd_cli.app.inputs import OpSettings, build_op
from bnbwd_cli.errors import InputError
from bnbwd_cli.judge import SetComparison
from bnbwd_cli.judge.tolerance import CompareSettings, Judging, PerOutput
from bnbwd_cli.render import json as report_json
from bnbwd_cli.render import text as report_text
from bnbwd_cli.status import Status

REFERENCE_LABEL = "bnbwd_cli.backward"
REPORT_WIDTH = 120  # the CLI's width when piped: reports read the same in a log and in a terminal


@dataclass(frozen=True)
class Report:
    """The verdict on a kernel's outputs: truthy iff every output passes.

    ``text`` is the report `bnbwd run --reference` prints, ``to_json()`` its JSON document (the same
    schema as `--json`), ``status`` "pass", "mismatch" or "structural", ``result`` the full comparison.
    """

    result: SetComparison
    actual_label: str = "kernel outputs"

    def __bool__(self) -> bool:
        return self.result.status == Status.PASS

    @property
    def status(self) -> str:
        return self.result.status.value

    @property
    def text(self) -> str:
        buffer = io.StringIO()
        console = Console(file=buffer, width=REPORT_WIDTH, color_system=None, highlight=False)
        report_text.render_report(console, self.result, report_text.Labels(self.actual_label, REFERENCE_LABEL),
                                  report_text.ReportStyle(problems_inline=True))
        return buffer.getvalue()

    def to_json(self) -> str:
        document = report_json.report_document(self.result, actual_label=self.actual_label,
                                               reference_label=REFERENCE_LABEL)
        return report_json.document_text(document)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"<bnbwd Report {self.status}: {', '.join(f'{o.name} {o.status}' for o in self.result.outputs)}>"


def _array(name: str, value: Any) -> np.ndarray:
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:  # ragged lists, objects NumPy cannot take
        raise InputError(f"{name}: not an array ({type(value).__name__}: {exc})") from None


def _inputs(arrays: Mapping[str, Any], op: OpSettings):
    """Array-likes -> checked Op (app/inputs.py, as every command checks them); arguments of the wrong kind are
    InputErrors too, never a TypeError or AttributeError from deep inside."""
    if op.epsilon is not None and (isinstance(op.epsilon, bool) or not isinstance(op.epsilon, numbers.Real)):
        raise InputError(f"epsilon is {op.epsilon!r}, expected a finite number > 0")
    if not isinstance(op.data_format, str):
        raise InputError(f"data_format is {op.data_format!r}, expected a layout name such as NCHW or NHWC")
    return build_op({name: _array(name, value) for name, value in arrays.items() if value is not None}, op)


def _outputs(actual: Any) -> dict[str, np.ndarray]:
    if not isinstance(actual, Mapping):
        raise InputError(f"actual is a {type(actual).__name__}, expected a mapping of output names to arrays")
    return {key: _array(key, value) for key, value in actual.items()}


def backward(src, diff_dst, mean, variance, gamma=None, *, epsilon: float, data_format: str = "NCX",
             training: bool = True, variance_is_invstd: bool = False) -> dict[str, np.ndarray]:
    """Batch-norm training backward: {"diff_src", "diff_gamma", "diff_beta"}.

    src, diff_dst: (N, C, X...) for data_format NCX (or NCHW...), (N, X..., C) for NXC (NHWC...), one
    dtype of f16/bf16/f32/f64; mean, variance, gamma: (C,). diff_src has src's dtype, diff_gamma and
    diff_beta mean's; computed in float64, rounded once. training=False is TF's is_training=False;
    variance_is_invstd: variance holds 1/sqrt(var + eps) (epsilon unused).

    >>> import numpy as np
    >>> src = np.array([[1.0, 2.0], [3.0, 6.0]])            # (N=2, C=2), NC
    >>> dy = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> grads = backward(src, dy, src.mean(0), src.var(0), epsilon=1e-12, data_format="NC")
    >>> grads["diff_beta"], grads["diff_gamma"].round(6)
    (array([1., 1.]), array([-1.,  1.]))
    >>> backward(src, dy, np.zeros(3), src.var(0), epsilon=1e-5, data_format="NC")
    Traceback (most recent call last):
    bnbwd_cli.errors.InputError: mean has shape (3,), expected (2,) = C of src (NCX)
    """
    op = OpSettings(epsilon, data_format, "generic", training, variance_is_invstd)
    problem = _inputs({"src": src, "diff_dst": diff_dst, "mean": mean, "variance": variance, "gamma": gamma}, op)
    return app_judge.reference_outputs(problem, ("diff_src", "diff_gamma", "diff_beta"))


def check(actual: Mapping[str, Any], *, src, diff_dst, mean, variance, gamma=None, epsilon: float,
          data_format: str = "NCX", training: bool = True, variance_is_invstd: bool = False,
          key_map: Mapping[str, str] | None = None, max_units: float | None = None) -> Report:
    """Judge a kernel's outputs as `bnbwd run --reference` does: truthy iff they pass.

    actual maps names to arrays: diff_src, diff_gamma, diff_beta, a spec's names for them
    (x_backprop...), or your own through key_map {THEIRS: OURS}; the ones present are judged, each
    element by the error a correct float32 kernel could make on this problem (max_units K, default 16).
    The other arguments are the inputs the kernel saw, as for backward().

    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> x = rng.normal(size=(64, 4)).astype(np.float32)     # (N, C), NXC
    >>> dy = rng.normal(size=x.shape).astype(np.float32)
    >>> inputs = dict(src=x, diff_dst=dy, mean=x.mean(0), variance=x.var(0), epsilon=1e-5, data_format="NXC")
    >>> mine = backward(**inputs)
    >>> check({"dx": mine["diff_src"]}, key_map={"dx": "diff_src"}, **inputs).status
    'pass'
    >>> wrong = {"diff_beta": mine["diff_beta"] / 64}        # a mean where the sum belongs: off by M
    >>> report = check(wrong, **inputs)
    >>> bool(report), report.status
    (False, 'mismatch')
    >>> "FAIL (exit 1): numerical mismatch in diff_beta" in report.text
    True
    """
    op = OpSettings(epsilon, data_format, "generic", training, variance_is_invstd)
    problem = _inputs({"src": src, "diff_dst": diff_dst, "mean": mean, "variance": variance, "gamma": gamma}, op)
    settings = CompareSettings() if max_units is None else CompareSettings(max_units=PerOutput(float(max_units), {}))
    return Report(app_judge.judge_outputs(problem, _outputs(actual), Judging(settings=settings, key_map=dict(key_map or {}))))


def assert_backward_close(actual: Mapping[str, Any], **inputs: Any) -> Report:
    """check(actual, **inputs), raising AssertionError with the report's text when it does not pass.

    >>> import numpy as np
    >>> x = np.arange(12, dtype=np.float64).reshape(3, 4)
    >>> dy = np.ones_like(x)
    >>> inputs = dict(src=x, diff_dst=dy, mean=x.mean(0), variance=x.var(0), epsilon=1e-5, data_format="NC")
    >>> assert_backward_close(backward(**inputs), **inputs).status
    'pass'
    >>> assert_backward_close({"diff_beta": np.zeros(4)}, **inputs)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    AssertionError: Comparison: actual kernel outputs vs reference bnbwd_cli.backward
    ...
    """
    report = check(actual, **inputs)
    if not report:
        raise AssertionError(report.text)
    return report
