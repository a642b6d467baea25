"""The Python API: bnbwd's backward pass and its judgement of a kernel, inside pytest, no subprocess.

The Python face of app/: the same input checks (app/inputs.py), core and judgement (app/judge.py) as
`bnbwd run --reference` and `bnbwd check`; only the way arrays come in (arguments, not files) and the
verdict goes out (a Report, not an exit code) differ. A bad input raises bnbwd_cli.InputError (a
ValueError) with the CLI's one-line message, less its advice on flags. No framework is imported: a torch
tensor is recognised by its type's module (torch is then loaded already), anything else goes through
__array__ or DLPack.

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

import contextlib
import io
import sys
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console

from bnbwd_cli.app import judge as app_judge
from bnbwd_cli.api_arguments import (Call, checked_op, choice, count_of, kernel_outputs, key_map_of, max_units_of,
                                     only_of, op_settings, text_of)
from bnbwd_cli.errors import InputError
from bnbwd_cli.files.common import short_repr
from bnbwd_cli.spec import OUTPUT_NAMES
from bnbwd_cli.judge import SetComparison
from bnbwd_cli.judge.comparison import errors_arrays
from bnbwd_cli.judge.tolerance import Judging, PerOutput
from bnbwd_cli.render import json as report_json
from bnbwd_cli.render import text as report_text
from bnbwd_cli.status import Status

REFERENCE_LABEL = "bnbwd_cli.backward"
API_TOOL = "bnbwd_cli.check"  # the JSON document's "tool"
FULL_REPORT = "full report: bnbwd_cli.check(...).text"
REPORT_WIDTH = 120  # the CLI's width when piped: reports read the same in a log and in a terminal


@dataclass(frozen=True)
class Report:
    """The verdict on a kernel's outputs: truthy iff every output passes.

    ``text`` is the report `bnbwd run --reference` prints, ``summary`` its few lines per output (the verdict,
    each output's tests and hints: what assert_backward_close raises), ``to_json()`` its JSON document (the
    same schema as `--json`), ``status`` "pass", "mismatch" or "structural", ``result`` the full comparison.
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
        return self._render(report_text.ReportStyle(problems_inline=True, face="api"))

    @property
    def summary(self) -> str:
        return self._render(report_text.ReportStyle(brief=True, problems_inline=True, face="api"))

    def _render(self, style: report_text.ReportStyle) -> str:
        buffer = io.StringIO()
        console = Console(file=buffer, width=REPORT_WIDTH, color_system=None, highlight=False, markup=False)
        with _quiet_numerics():  # details the report shows are computed now
            report_text.render_report(console, self.result, report_text.Labels(self.actual_label, REFERENCE_LABEL),
                                      style)
        return buffer.getvalue()

    def errors(self, name: str = "diff_src") -> dict[str, np.ndarray]:
        """Every element's judgement of one output (canonical name or the key given), in the output's own shape, for
        your own plots: "failing" and "nonfinite" (bool), "ratio" (error / allowance, > 1 fails) and, under the
        scaled rule, "units" (float32, NaN where a side is not finite): what `--save-error FILE.npz` writes."""
        row = next((o for o in self.result.outputs if name in (o.name, o.actual_key)), None)
        if row is None or row.comparison is None:
            raise KeyError(f"{name}: no such output was judged")
        with _quiet_numerics():
            return errors_arrays(row.comparison.errors)

    def to_json(self) -> str:
        with _quiet_numerics():
            document = report_json.report_document(self.result, report_json.Source(API_TOOL, self.actual_label,
                                                                                    REFERENCE_LABEL))
        return report_json.document_text(document)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"<bnbwd Report {self.status}: {', '.join(f'{o.name} {o.status}' for o in self.result.outputs)}>"


class _QuietNumerics:
    """NumPy's RuntimeWarnings silenced while any call of the API runs: inf, NaN and zero variance are inputs the
    core and the judge handle (and count), so a warning on the way would be noise, and under pytest's
    filterwarnings=error a failure of the caller's test. np.errstate is per thread; the All-NaN warnings of NumPy's
    nan-functions need a filter, and warnings.catch_warnings is not thread-safe (two threads each restoring what
    the other saved left the process's filters changed): the filter is installed by the first call in and removed by
    the last call out, under a lock."""

    _lock = threading.Lock()
    _active = 0
    _saved: warnings.catch_warnings | None = None

    @classmethod
    @contextlib.contextmanager
    def held(cls):
        with cls._lock:
            if cls._active == 0:
                cls._saved = warnings.catch_warnings()
                cls._saved.__enter__()
                warnings.simplefilter("ignore", RuntimeWarning)
            cls._active += 1
        try:
            with np.errstate(all="ignore"):
                yield
        finally:
            with cls._lock:
                cls._active -= 1
                if cls._active == 0:
                    cls._saved.__exit__(None, None, None)
                    cls._saved = None


_quiet_numerics = _QuietNumerics.held


class NumbaFallbackWarning(UserWarning):
    """numba could not start in this process (its own settings: NUMBA_NUM_THREADS=0, a threading layer that is not
    installed, no home for its cache) and the NumPy core ran instead: the same bits, slower. Warned once a process,
    as the CLI's note is printed once a command; a category of its own, so that a test suite can filter it."""


_fallback_warned = threading.Event()


def _warn_numba_fallback() -> None:
    """The CLI's numba note as the API's warning, once a process (outside _quiet_numerics: it is no numerics noise)."""
    runtime = sys.modules.get("bnbwd_cli.runtime")
    notes = getattr(runtime, "NUMBA_FALLBACK", ())
    if notes and not _fallback_warned.is_set():
        _fallback_warned.set()
        warnings.warn(f"bnbwd: {notes[0]}", NumbaFallbackWarning, stacklevel=3)


def backward(src=None, diff_dst=None, mean=None, variance=None, gamma=None, *, epsilon: float | None = None,
             data_format: str | None = None, training: bool = True, variance_is_invstd: bool = False,
             spec: str = "generic", **named: Any) -> dict[str, np.ndarray]:
    """Batch-norm training backward: {"diff_src", "diff_gamma", "diff_beta"} as NumPy arrays.

    src, diff_dst: (N, C, X...) for data_format NCX (or NCHW...), (N, X..., C) for NXC (NHWC...), one
    dtype of f16/bf16/f32/f64; mean, variance, gamma: (C,). Arrays are NumPy's, torch tensors (any dtype,
    requires_grad, strided, on a GPU), JAX or TensorFlow arrays (__array__ or DLPack). The inputs may also
    go by a spec's or PyTorch's names (input=, grad_output=, weight=, save_mean=, save_invstd=: then
    variance_is_invstd is implied). data_format is required (a channels_last tensor is logically NCHW).
    diff_src has src's dtype, diff_gamma and diff_beta mean's; computed in float64, rounded once.
    training=False is TF's is_training=False; variance_is_invstd: variance holds 1/sqrt(var + eps).

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
    arrays = {"src": src, "diff_dst": diff_dst, "mean": mean, "variance": variance, "gamma": gamma, **named}
    op = checked_op(Call(arrays, op_settings(epsilon, data_format, spec, training, variance_is_invstd), {}))
    with _quiet_numerics():
        outputs = app_judge.reference_outputs(op, OUTPUT_NAMES)
    _warn_numba_fallback()
    return outputs


def check(actual: Any, *, src=None, diff_dst=None, mean=None, variance=None, gamma=None,
          epsilon: float | None = None, data_format: str | None = None, training: bool = True,
          variance_is_invstd: bool = False, spec: str = "generic", key_map: Mapping[str, str] | None = None,
          max_units: float | None = None, only: Any = None, ftz: bool = True, **named: Any) -> Report:
    """Judge a kernel's outputs as `bnbwd run --reference` does: truthy iff they pass.

    actual maps names to arrays: diff_src, diff_gamma, diff_beta, a spec's or PyTorch's names for them
    (x_backprop, grad_input...), or your own through key_map {THEIRS: OURS}; or it is a tuple or list in
    (diff_src, diff_gamma, diff_beta) order (None where an output was not made). Each element is judged by the
    error a correct float32 kernel could make on this problem (max_units K, default 16 for diff_src). Every output
    must be there: one missing makes the report "structural" (falsy, the CLI's exit 3), naming it; only= (an
    output's name, names joined by commas or a sequence of them: the CLI's --only) judges fewer. The other arguments are the inputs the
    kernel saw, as for backward(). ftz=False fails an element written as 0 where the reference is subnormal
    (by default it passes, counted in a note: a kernel built with flush-to-zero). The caller's arrays are never
    changed.

    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> x = rng.normal(size=(64, 4)).astype(np.float32)     # (N, C), NXC
    >>> dy = rng.normal(size=x.shape).astype(np.float32)
    >>> inputs = dict(src=x, diff_dst=dy, mean=x.mean(0), variance=x.var(0), epsilon=1e-5, data_format="NXC")
    >>> mine = backward(**inputs)
    >>> check({"dx": mine["diff_src"]}, key_map={"dx": "diff_src"}, only="diff_src", **inputs).status
    'pass'
    >>> check((mine["diff_src"], None, mine["diff_beta"]), **inputs).status      # diff_gamma missing
    'structural'
    >>> check((mine["diff_src"], None, mine["diff_beta"]), only=("diff_src", "diff_beta"), **inputs).status
    'pass'
    >>> wrong = dict(mine, diff_beta=mine["diff_beta"] / 64)   # a mean where the sum belongs: off by M
    >>> report = check(wrong, **inputs)
    >>> bool(report), report.status
    (False, 'mismatch')
    >>> "FAIL: numerical mismatch in diff_beta" in report.text
    True
    """
    key_map, max_units, only = key_map_of(key_map), max_units_of(max_units), only_of(only)
    arrays = {"src": src, "diff_dst": diff_dst, "mean": mean, "variance": variance, "gamma": gamma, **named}
    op = checked_op(Call(arrays, op_settings(epsilon, data_format, spec, training, variance_is_invstd), key_map))
    if not isinstance(ftz, bool):
        raise InputError(f"ftz is {short_repr(ftz)}, expected True or False")
    judging = Judging(max_units=PerOutput(max_units, {}), key_map=key_map, only=only, ftz=ftz)
    with _quiet_numerics():
        report = Report(app_judge.judge_kernel(op, kernel_outputs(actual), judging))
    _warn_numba_fallback()
    return report


def assert_backward_close(actual: Mapping[str, Any], **inputs: Any) -> Report:
    """check(actual, **inputs), raising AssertionError when it does not pass: the verdict, each output's tests
    against their thresholds, its hints and worst element (Report.summary, a few lines per output, as
    torch.testing.assert_close's); the full report is check(...).text.

    >>> import numpy as np
    >>> x = np.arange(12, dtype=np.float64).reshape(3, 4)
    >>> dy = np.ones_like(x)
    >>> inputs = dict(src=x, diff_dst=dy, mean=x.mean(0), variance=x.var(0), epsilon=1e-5, data_format="NC")
    >>> assert_backward_close(backward(**inputs), **inputs).status
    'pass'
    >>> assert_backward_close({"diff_beta": np.zeros(4)}, only="diff_beta", **inputs)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    AssertionError: FAIL: numerical mismatch in diff_beta
    ...
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this frame
    report = check(actual, **inputs)
    if not report:
        raise AssertionError(report.summary + FULL_REPORT)
    return report


class Case:
    """One case of `bnbwd cases`' suite, in memory: the arrays its NAME.npz holds, and its judge.

    ``str(case)`` is its name (NAME of NAME.npz); ``inputs`` maps src, diff_dst, mean, variance, gamma to NumPy
    arrays (read-only; src and diff_dst in the suite's dtype and ``data_format``, bfloat16 as ml_dtypes'),
    ``epsilon`` a float, ``is_training`` True; ``shape`` is (N, C, spatial...), ``targets`` the bug classes it
    targets and ``why`` why its data exposes them. The arrays are drawn on first use, the same bytes as the file.
    """

    def __init__(self, spec: Any, settings: Any) -> None:
        self._spec, self._settings, self._arrays = spec, settings, None

    def __str__(self) -> str:
        return self._spec.name

    def __repr__(self) -> str:
        return f"<bnbwd Case {self._spec.name} {'x'.join(map(str, self.shape))} {self._settings.dtype} {self.data_format}>"

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def shape(self) -> tuple[int, ...]:
        return self._spec.shape

    @property
    def targets(self) -> tuple[str, ...]:
        from bnbwd_cli.app import cases as app_cases

        return app_cases.targets_for(self._spec, self._settings.dtype)

    @property
    def why(self) -> str:
        return self._spec.why

    def _bundle(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            from bnbwd_cli.app import cases as app_cases

            arrays = app_cases.case_arrays(self._spec, self._settings)
            for array in arrays.values():
                array.flags.writeable = False  # shared by every caller of this case: a kernel must not change them
            self._arrays = arrays
        return self._arrays

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        from bnbwd_cli.app.cases import INPUT_NAMES

        return {name: self._bundle()[name] for name in INPUT_NAMES}

    @property
    def epsilon(self) -> float:
        return float(self._spec.recipe.epsilon)

    @property
    def data_format(self) -> str:
        return str(self._bundle()["data_format"])

    @property
    def is_training(self) -> bool:
        return True

    def check(self, actual: Any, **options: Any) -> Report:
        """check(actual, ...) on this case's inputs and settings: a Report, truthy iff the outputs pass; options
        are check()'s key_map, max_units, only, ftz and spec."""
        return check(actual, **self.inputs, epsilon=self.epsilon, data_format=self.data_format,
                     training=self.is_training, **options)

    def assert_close(self, actual: Any, **options: Any) -> Report:
        """assert_backward_close(actual, ...) on this case: AssertionError with the verdict when it fails."""
        __tracebackhide__ = True  # pytest shows the caller's line, not this frame
        return assert_backward_close(actual, **self.inputs, epsilon=self.epsilon, data_format=self.data_format,
                                     training=self.is_training, **options)


def cases(preset: str = "default", dtype: str = "f32", *, data_format: str = "NCX", seed: int = 0, count: int = 0,
          max_elements: int | None = None) -> list[Case]:
    """The suite `bnbwd cases` writes, as Case objects in the same order and with the same values as its
    NAME.npz files (`bnbwd cases --preset P --dtype D --format F --seed S --count K -o DIR`): the preset's cases
    (default, tiny or resnet50), then `count` generated from `seed` (at most `max_elements` elements each).
    A layout name that fixes a rank (NCHW) keeps that rank's cases. For pytest:
    ``@pytest.mark.parametrize("case", bnbwd_cli.cases(), ids=str)``.

    >>> suite = cases(preset="tiny")
    >>> case = suite[0]
    >>> str(case), sorted(case.inputs), case.epsilon, case.data_format
    ('baseline', ['diff_dst', 'gamma', 'mean', 'src', 'variance'], 1e-05, 'NCX')
    >>> bool(case.check(backward(**case.inputs, epsilon=case.epsilon, data_format=case.data_format)))
    True
    """
    from bnbwd_cli.app import cases as app_cases

    settings = app_cases.SuiteSettings(
        dtype=choice("dtype", dtype, tuple(app_cases.DTYPES)), data_format=text_of("data_format", data_format),
        preset=choice("preset", preset, app_cases.PRESETS), seed=count_of("seed", seed), count=count_of("count", count),
        max_elements=app_cases.GENERATED_ELEMENTS if max_elements is None else count_of("max_elements", max_elements))
    specs = app_cases.suite_specs(settings)  # InputError for a layout name that is none
    return [Case(spec, settings) for spec in specs if app_cases.left_out_by_rank(spec, settings) is None]
