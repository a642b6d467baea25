#!/usr/bin/env python3
"""Calibrate the judge's error model: how many units correct kernels use, and how many bugs use.

Dev-only. Runs, on generated problems, three kinds of kernel against bnbwd's own output (the
NumPy core) and judges each with ``compare_sets(..., inputs=...)``, the rule ``run --reference`` and
``verify --inputs`` apply:

1. PyTorch CPU (correct): ``aten.native_batch_norm_backward`` with train=True; f32 NCHW,
   f32 channels_last, f16 NCHW and bf16 NCHW (weight and saved stats in f32), M ~ 1e3, 1e4 and the
   ResNet-50 first-stage size (32, 64, 56, 56) (M = 100352) for f32 in both layouts.
   Skipped with a note when torch is not importable.
2. The NumPy kernel zoo (correct, tools/zoo.py): every accumulation order in zoo.ORDERS, for
   T1/T2 in f32/f32, f16/f32, bf16/f32, bf16/bf16, NCX and NXC, a grid of M, 8 channels; plus
   harder data (|mean|/sd ~ 1e3 via center=1e3, and diff_dst offset by 100).
3. Planted bugs (tools/zoo.py zoo.BUGS) on the same problems. A bug whose outputs are
   bit-identical to the correct sequential kernel's on a problem (e.g. most bugs at M = 1) is a
   no-op there and is skipped (counted in the summary). 'nhwc-as-nchw' runs on its own NXC
   problems of shape (n, 8, W, 8), where C == H.
4. Stress (not with --quick or --no-stress): diff_dst = offset + N(0, 1) with a large offset, where
   a float32 accumulator's roundings stop being independent and a reduced-precision diff_dst takes
   few distinct values: PyTorch in every dtype/layout at M ~ 1e5 (offset 100), PyTorch
   channels_last (default and 1 thread) and all zoo orders at M ~ 4e5 (offset 1000).

For each kernel and output it records the worst error in units (``max_units``), the verdict, and
the systematic-deviation estimate (bias scale and z), prints Markdown tables and summary lines,
and with ``--write`` writes them to docs/tolerances_table.md.

    python -m tools.calibrate_tolerances            # full grid + stress section (~2 min on 2 cores)
    python -m tools.calibrate_tolerances --quick    # smaller grid, no stress section (~30 s)
    python -m tools.calibrate_tolerances --write    # also write docs/tolerances_table.md
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bnbwd_cli.dtypes import dtype_name, to_float64, unit_roundoff
from bnbwd_cli.judge import Judging, compare_sets
from bnbwd_cli.judge.tolerance import BIAS_FLOOR_UNITS, BIAS_Z, default_max_units
from tools import zoo
from tools.torch_bridge import to_numpy, to_torch

OUTPUTS = ("diff_src", "diff_gamma", "diff_beta")
SHORT = {"diff_src": "src", "diff_gamma": "gamma", "diff_beta": "beta"}
DTYPE_PAIRS = ((np.float32, np.float32), (np.float16, np.float32), (zoo.BF16, np.float32), (zoo.BF16, zoo.BF16))
LAYOUTS = ("NCX", "NXC")
FULL_M = (1, 7, 1000, 100000)
QUICK_M = (7, 1000, 20000)
CHANNELS = 8
HARD_DATA = (("center=1e3", {"center": 1e3}), ("dy_offset=100", {"dy_offset": 100.0}))
TORCH_M = (1000, 10000)
RESNET_NCHW = (32, 64, 56, 56)
STRESS_M = 400000
STRESS_OFFSET = 1000.0
TORCH_CHANNELS = 64
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "tolerances_table.md"


# --------------------------------------------------------------------------- records


@dataclass
class OutputRow:
    """One output's judgement."""

    units: float | None  # worst element's error in units (None: not judged by the error model)
    elements_ok: bool
    bias_failed: bool
    bias_scale: float | None
    bias_z: float | None
    bias_threshold: float | None
    bias_significant: bool


@dataclass
class Row:
    """One kernel on one problem."""

    group: str  # "torch", "zoo", "bug"
    kernel: str
    data: str  # "" for the default data, else e.g. "center=1e3"
    t1: str
    t2: str
    layout: str
    m: int
    shape: tuple[int, ...]
    outputs: dict[str, OutputRow]
    effect: tuple[float, str] | None = None  # bugs: (normwise relative change vs the correct kernel, output)
    note: str = ""

    @property
    def passed(self) -> bool:
        return all(o.elements_ok and not o.bias_failed for o in self.outputs.values())

    @property
    def reason(self) -> str:
        if any(not o.elements_ok for o in self.outputs.values()):
            return "elements"
        if any(o.bias_failed for o in self.outputs.values()):
            return "bias"
        return ""

    @property
    def worst_units(self) -> float:
        values = [o.units for o in self.outputs.values() if o.units is not None and math.isfinite(o.units)]
        return max(values) if values else 0.0

    @property
    def failing_units(self) -> float:
        """Worst units among the outputs that fail element-wise (inf if one fails on non-finite values)."""
        values = [o.units if o.units is not None else math.inf for o in self.outputs.values() if not o.elements_ok]
        return max(values) if values else math.nan

    @property
    def label(self) -> str:
        return self.kernel + (f" [{self.data}]" if self.data else "")

    def describe(self) -> str:
        return f"{self.label} {self.t1}/{self.t2} {self.layout} M={self.m} shape={self.shape}"


# --------------------------------------------------------------------------- judging


def judge(problem: dict, outs: dict, truth: dict) -> dict[str, OutputRow]:
    result = compare_sets(outs, truth, Judging(), inputs=zoo.inputs_of(problem))
    rows = {}
    for out in result.outputs:
        if out.comparison is None:  # a structural problem (shape/dtype/missing): a harness error
            raise RuntimeError(f"{out.name}: {out.problem}")
        c = out.comparison
        b = c.bias
        rows[out.name] = OutputRow(
            units=None if c.max_units is None else float(c.max_units.value),
            elements_ok=bool(c.elements_passed),
            bias_failed=bool(c.bias_failed),
            bias_scale=None if b is None else float(b.scale),
            bias_z=None if b is None else float(b.z),
            bias_threshold=None if b is None else float(b.threshold),
            bias_significant=bool(b is not None and b.significant),
        )
    return rows


def same_outputs(a: dict, b: dict) -> bool:
    return all(np.array_equal(to_float64(a[k]), to_float64(b[k]), equal_nan=True) for k in OUTPUTS)


def effect_of(bug: dict, correct: dict) -> tuple[float, str]:
    """How far a bug moves the outputs from a correct kernel's: the largest normwise relative change
    max|bug - correct| / max|correct| over the outputs, and which output it is."""
    worst, where = 0.0, OUTPUTS[0]
    for k in OUTPUTS:
        b, c = to_float64(bug[k]), to_float64(correct[k])
        if b.size == 0:
            continue
        if not np.isfinite(b).all():
            return math.inf, k
        norm = float(np.abs(c).max())
        change = float(np.abs(b - c).max())
        rel = change / norm if norm > 0 else (math.inf if change > 0 else 0.0)
        if rel > worst:
            worst, where = rel, k
    return worst, where


def name_of(dtype) -> str:
    return dtype_name(np.dtype(dtype))


def m_of(shape, fmt: str) -> int:
    c = shape[1] if fmt == "NCX" else shape[-1]
    return int(np.prod(shape)) // c


# --------------------------------------------------------------------------- PyTorch


def torch_or_none():
    try:
        import torch
    except Exception:  # any import failure means "no torch"
        return None
    return torch


def torch_kernel(torch, problem: dict) -> dict:
    """aten.native_batch_norm_backward (train=True) on the problem; outputs back in the problem's layout."""
    fmt = problem["data_format"]
    x, dy = to_torch(torch, problem["src"]), to_torch(torch, problem["diff_dst"])
    if fmt == "NXC":  # NHWC storage viewed as NCHW: that is exactly torch.channels_last
        x = x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
        dy = dy.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
        assert x.is_contiguous(memory_format=torch.channels_last)
    eps = float(problem["epsilon"])
    weight = to_torch(torch, problem["gamma"])
    save_mean = torch.from_numpy(problem["mean"].astype(np.float32))
    invstd = (1.0 / np.sqrt(to_float64(problem["variance"]) + eps)).astype(np.float32)
    save_invstd = torch.from_numpy(invstd)
    gi, gw, gb = torch.ops.aten.native_batch_norm_backward(dy, x, weight, None, None, save_mean, save_invstd, True, eps,
                                                           [True, True, True])
    if fmt == "NXC":
        gi = gi.permute(0, 2, 3, 1)
    stats_dtype = problem["mean"].dtype  # torch returns grad_weight/grad_bias in the weight's dtype == T2 here
    outs = {"diff_src": to_numpy(gi), "diff_gamma": to_numpy(gw), "diff_beta": to_numpy(gb)}
    wanted = {"diff_src": problem["src"].dtype, "diff_gamma": stats_dtype, "diff_beta": stats_dtype}
    for key, dtype in wanted.items():
        assert outs[key].dtype == dtype, (key, outs[key].dtype, dtype)
    return outs


def torch_cases(quick: bool) -> list[tuple[tuple, str, tuple[int, ...]]]:
    """(dtype pair, layout, shape) for the PyTorch rows of the main grid."""
    cases = []
    for t1, t2, fmt in ((np.float32, np.float32, "NCX"), (np.float32, np.float32, "NXC"),
                        (np.float16, np.float32, "NCX"), (zoo.BF16, np.float32, "NCX")):
        for m in TORCH_M:
            cases.append(((t1, t2), fmt, zoo.shape_for(m, TORCH_CHANNELS, fmt)))
        if not quick and t1 is np.float32:
            n, c, h, w = RESNET_NCHW
            cases.append(((t1, t2), fmt, RESNET_NCHW if fmt == "NCX" else (n, h, w, c)))
    return cases


def torch_row(torch, rng, t1, t2, fmt: str, shape, tag: str = "", threads: int | None = None, **data) -> Row:
    """One PyTorch run on a fresh problem (``threads``: intra-op threads for this run only)."""
    problem = zoo.make_problem(rng, shape, fmt, t1, t2, **data)
    truth = zoo.bnbwd_outputs(problem)
    before = torch.get_num_threads()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        outs = torch_kernel(torch, problem)
    finally:
        torch.set_num_threads(before)
    layout = "NCHW" if fmt == "NCX" else "channels_last"
    kernel = "torch-cpu" + (f" ({threads} thread{'s' if threads > 1 else ''})" if threads is not None else "")
    return Row("torch", kernel, tag, name_of(t1), name_of(t2), layout, m_of(shape, fmt), tuple(shape),
               judge(problem, outs, truth))


def run_torch(rng, quick: bool, log) -> tuple[list[Row], str]:
    torch = torch_or_none()
    if torch is None:
        return [], "PyTorch is not importable here: the PyTorch rows were skipped."
    rows = []
    for (t1, t2), fmt, shape in torch_cases(quick):
        rows.append(torch_row(torch, rng, t1, t2, fmt, shape))
        log(rows[-1])
    note = (f"PyTorch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s) unless a row says otherwise; "
            "save_invstd = 1/sqrt(var + eps) in float64 rounded to float32; weight and saved stats float32.")
    return rows, note


def run_stress(rng, log, use_torch: bool = True) -> tuple[list[Row], str]:
    """Beyond the grid: diff_dst with |mean| >> sd (dy_offset) at large M, for PyTorch and the zoo.

    A diff_dst whose mean dominates its spread makes the roundings of a float32 accumulator
    correlated (the terms are all about the same), and makes a reduced-precision diff_dst take few
    distinct values. Both are where the error model's assumptions are weakest.
    """
    rows = []
    torch = torch_or_none() if use_torch else None
    if torch is not None:
        for t1 in (np.float32, np.float16, zoo.BF16):
            for fmt in LAYOUTS:
                rows.append(torch_row(torch, rng, t1, np.float32, fmt, zoo.shape_for(100000, TORCH_CHANNELS, fmt),
                                      "dy_offset=100", dy_offset=100.0))
                log(rows[-1])
        for t1 in (np.float32, zoo.BF16):
            for threads in (None, 1):
                rows.append(torch_row(torch, rng, t1, np.float32, "NXC", zoo.shape_for(STRESS_M, CHANNELS, "NXC"),
                                      f"dy_offset={STRESS_OFFSET:g}", threads, dy_offset=STRESS_OFFSET))
                log(rows[-1])
    for t1 in (np.float32, zoo.BF16):
        for fmt in LAYOUTS:
            problem = zoo.make_problem(rng, zoo.shape_for(STRESS_M, CHANNELS, fmt), fmt, t1, np.float32,
                                       dy_offset=STRESS_OFFSET)
            truth = zoo.bnbwd_outputs(problem)
            for order in zoo.ORDERS:
                rows.append(Row("zoo", f"zoo/{order}", f"dy_offset={STRESS_OFFSET:g}", name_of(t1), "f32", fmt,
                                m_of(problem["src"].shape, fmt), problem["src"].shape,
                                judge(problem, zoo.kernel(problem, order), truth)))
                log(rows[-1])
    note = ("" if torch is not None else "No PyTorch (not importable, or --no-torch): only the zoo rows were run. ") + (
        f"diff_dst = dy_offset + N(0, 1): PyTorch at M ~ 1e5 with dy_offset = 100 in every dtype and layout, "
        f"then PyTorch channels_last and the zoo at M ~ {STRESS_M:g} with dy_offset = {STRESS_OFFSET:g}.")
    return rows, note


# --------------------------------------------------------------------------- the NumPy zoo


def zoo_problems(rng, m_grid) -> Iterator[tuple[str, dict]]:
    """(data tag, problem) for the zoo grid: default data at every M, harder data at the two largest M."""
    for t1, t2 in DTYPE_PAIRS:
        for fmt in LAYOUTS:
            for m in m_grid:
                yield "", zoo.make_problem(rng, zoo.shape_for(m, CHANNELS, fmt), fmt, t1, t2)
            for tag, kwargs in HARD_DATA:
                for m in sorted(m_grid)[-2:]:
                    yield tag, zoo.make_problem(rng, zoo.shape_for(m, CHANNELS, fmt), fmt, t1, t2, **kwargs)


def square_nxc_shape(m: int, c: int = CHANNELS) -> tuple[int, int, int, int]:
    """(n, H, W, C) with H == C and about m elements per channel: what 'nhwc-as-nchw' needs."""
    if m >= c * c:
        return (max(1, round(m / (c * c))), c, c, c)
    return (1, c, max(1, round(m / c)), c)


def run_zoo(rng, m_grid, log) -> tuple[list[Row], list[Row], dict[str, int]]:
    correct, bugs = [], []
    noops: dict[str, int] = {}
    plain_bugs = [b for b in zoo.BUGS if b != "nhwc-as-nchw"]
    for tag, problem in zoo_problems(rng, m_grid):
        fmt = problem["data_format"]
        shape = problem["src"].shape
        meta = (tag, name_of(problem["src"].dtype), name_of(problem["mean"].dtype), fmt, m_of(shape, fmt), tuple(shape))
        truth = zoo.bnbwd_outputs(problem)
        sequential = None
        for order in zoo.ORDERS:
            outs = zoo.kernel(problem, order)
            if order == "sequential":
                sequential = outs
            row = Row("zoo", f"zoo/{order}", *meta, judge(problem, outs, truth))
            correct.append(row)
            log(row)
        for bug in plain_bugs:
            with np.errstate(all="ignore"):  # some bugs overflow float16 on purpose
                outs = zoo.kernel(problem, "sequential", bug=bug)
            if same_outputs(outs, sequential):
                noops[bug] = noops.get(bug, 0) + 1
                continue
            row = Row("bug", f"bug/{bug}", *meta, judge(problem, outs, truth), effect=effect_of(outs, sequential))
            bugs.append(row)
            log(row)
    if "nhwc-as-nchw" in zoo.BUGS:
        for t1, t2 in DTYPE_PAIRS:
            for m in m_grid:
                shape = square_nxc_shape(m)
                problem = zoo.make_problem(rng, shape, "NXC", t1, t2)
                truth = zoo.bnbwd_outputs(problem)
                sequential = zoo.kernel(problem, "sequential")
                with np.errstate(all="ignore"):
                    outs = zoo.kernel(problem, "sequential", bug="nhwc-as-nchw")
                if same_outputs(outs, sequential):
                    noops["nhwc-as-nchw"] = noops.get("nhwc-as-nchw", 0) + 1
                    continue
                row = Row("bug", "bug/nhwc-as-nchw", "", name_of(t1), name_of(t2), "NXC", m_of(shape, "NXC"), shape,
                          judge(problem, outs, truth), effect=effect_of(outs, sequential))
                bugs.append(row)
                log(row)
    return correct, bugs, noops


# --------------------------------------------------------------------------- formatting


def fmt_units(o: OutputRow) -> str:
    if o.units is None:
        text = "n/a"
    elif not math.isfinite(o.units):
        text = "inf"
    elif o.units == 0:
        text = "0"
    elif o.units < 100:
        text = f"{o.units:.3g}"
    else:
        text = f"{o.units:.2e}"
    if not o.elements_ok:
        text = f"**{text}** E"
    if o.bias_failed:
        text += " B"
    return text


def fmt_z(z: float | None) -> str:
    if z is None:
        return "-"
    if not math.isfinite(z):
        return "inf"
    return f"{z:.3g}" if z < 1e4 else f"{z:.1e}"


def fmt_bias(row: Row) -> str:
    """The significant biases, or else the output whose bias estimate has the largest z."""
    known = {k: o for k, o in row.outputs.items() if o.bias_scale is not None}
    if not known:
        return "-"
    chosen = [k for k, o in known.items() if o.bias_significant]
    if not chosen:
        chosen = [max(known, key=lambda k: known[k].bias_z if math.isfinite(known[k].bias_z) else 1e300)]
    parts = []
    for k in chosen:
        o = known[k]
        parts.append(f"{SHORT[k]}: {o.bias_scale:.2g}, {fmt_z(o.bias_z)}{'*' if o.bias_significant else ''}")
    return "; ".join(parts)


def fmt_verdict(row: Row) -> str:
    return "PASS" if row.passed else f"FAIL ({row.reason})"


HEADER = ("| kernel | dtype T1/T2 | layout | M | diff_src units | diff_gamma units | diff_beta units "
          "| bias (output: scale, z) | verdict |\n|---|---|---|---:|---:|---:|---:|---|---|")


def table(rows: list[Row]) -> str:
    lines = [HEADER]
    for r in rows:
        cells = [r.label, f"{r.t1}/{r.t2}", r.layout, str(r.m)] + [fmt_units(r.outputs[k]) for k in OUTPUTS]
        cells += [fmt_bias(r), fmt_verdict(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _units_text(x: float) -> str:
    return "inf" if not math.isfinite(x) else (f"{x:.3g}" if x < 1e4 else f"{x:.2e}")


def correct_summary(name: str, rows: list[Row]) -> list[str]:
    if not rows:
        return [f"- **{name}**: no rows."]
    worst = max(rows, key=lambda r: r.worst_units)
    per_output = []
    for k in OUTPUTS:
        values = [r.outputs[k].units for r in rows if r.outputs[k].units is not None]
        per_output.append(f"{k} {_units_text(max(values)) if values else 'n/a'}")
    zs = [(o.bias_z, r, k) for r in rows for k, o in r.outputs.items()
          if o.bias_z is not None and math.isfinite(o.bias_z)]
    z_text = ""
    if zs:
        z, zr, zk = max(zs, key=lambda t: t[0])
        z_text = f"; largest bias z {z:.3g} ({zk} of {zr.describe()})"
    ratios = [(abs(o.bias_scale) / o.bias_threshold, r, k) for r in rows for k, o in r.outputs.items()
              if o.bias_scale is not None and o.bias_threshold and not o.bias_significant]
    if ratios:
        q, qr, qk = max(ratios, key=lambda t: t[0])
        z_text += f"; closest non-significant bias: |scale|/threshold {q:.2g} ({qk} of {qr.describe()})"
    failed = [r for r in rows if not r.passed]
    line = (f"- **{name}** ({len(rows)} runs): worst units {_units_text(worst.worst_units)} ({worst.describe()}); "
            f"per output: {', '.join(per_output)}{z_text}; "
            f"{'all PASS' if not failed else f'**{len(failed)} FAILED**'}.")
    lines = [line]
    for r in failed:
        lines.append(f"  - FAILED: {r.describe()}: {fmt_verdict(r)}; "
                     + ", ".join(f"{k} {fmt_units(r.outputs[k])}" for k in OUTPUTS) + f"; bias {fmt_bias(r)}")
    return lines


def bug_summary(rows: list[Row], noops: dict[str, int]) -> list[str]:
    lines = []
    element_fails = [r for r in rows if r.reason == "elements"]
    if element_fails:
        mildest = min(element_fails, key=lambda r: r.failing_units)
        lines.append(f"- **planted bugs** ({len(rows)} runs): smallest units among element-wise failures "
                     f"{_units_text(mildest.failing_units)} ({mildest.describe()}); "
                     f"{len(element_fails)} fail on elements, {sum(r.reason == 'bias' for r in rows)} on bias only, "
                     f"{sum(r.passed for r in rows)} PASS.")
    for bug in zoo.BUGS:
        mine = [r for r in rows if r.kernel == f"bug/{bug}"]
        el = [r for r in mine if r.reason == "elements"]
        bi = [r for r in mine if r.reason == "bias"]
        ok = [r for r in mine if r.passed]
        parts = [f"{len(mine)} runs", f"{len(el)} fail on elements", f"{len(bi)} on bias only", f"{len(ok)} PASS"]
        if noops.get(bug):
            parts.append(f"{noops[bug]} no-op problems skipped")
        if el:
            mildest = min(el, key=lambda r: r.failing_units)
            parts.append(f"smallest failing units {_units_text(mildest.failing_units)} ({mildest.t1}/{mildest.t2} "
                         f"{mildest.layout} M={mildest.m}{' ' + mildest.data if mildest.data else ''})")
        lines.append(f"  - `{bug}`: " + "; ".join(parts) + ".")
        for r in ok:
            rel, out = r.effect
            dtype = r.t1 if out == "diff_src" else r.t2
            lines.append(f"    - PASSED: {r.describe()}: changes the outputs by at most {rel:.2g} (normwise relative, "
                         f"{out}) from the correct sequential kernel's; {dtype}'s unit roundoff is "
                         f"{unit_roundoff(dtype):.2g}")
    return lines


def k_text() -> str:
    """K per output, as the judge applies it (judge/tolerance.default_max_units)."""
    by_k: dict[float, list[str]] = {}
    for name in OUTPUTS:
        by_k.setdefault(default_max_units(name), []).append(name)
    return "K = " + ", ".join(f"{k:g} for {' and '.join(names)}" for k, names in sorted(by_k.items(), reverse=True))


def rules_paragraph() -> str:
    """How the rows are judged, from the judge's constants (tests/test_tools.py holds the committed table to it)."""
    return ("Every kernel is judged against bnbwd's own output (NumPy core) by `compare_sets(..., inputs=...)`, the "
            "rule `run --reference` / `verify --inputs` apply. *Units*: the worst element's `max(0, |a - r| - ulp) / s`, "
            "s the error model's scale for that element (judge/model.py). An element fails above "
            f"K units, {k_text()} (**bold** + `E`); an output also fails (`B`) on a systematic deviation "
            f"(bias) more than {BIAS_Z:g} standard errors from zero and above {BIAS_FLOOR_UNITS:g} unit roundoffs "
            "(u = 2^-24), or with a channel that is. "
            "The bias column gives the output(s) whose bias is significant (`*`), otherwise the output with the largest z: "
            "the fitted relative scale (actual ~ (1 + scale) * reference) and its z. "
            "M is the number of elements per channel.")


def failures(rows: list[Row]) -> str:
    failed = [r for r in rows if not r.passed]
    if not failed:
        return f"all {len(rows)} PASS"
    return (f"**{len(failed)} of {len(rows)} FAILED** ({sum(r.reason == 'elements' for r in failed)} on elements, "
            f"{sum(r.reason == 'bias' for r in failed)} on bias only)")


# The PyTorch rows need torch, which a machine may not have: a run without it keeps them as the last run with it
# wrote them, between these markers (their first line says which run that was).
TORCH_BEGIN = "<!-- PyTorch rows: rewritten only by a run with torch importable; kept as they are otherwise -->"
TORCH_END = "<!-- end of the PyTorch rows -->"


def torch_block(command: str, rows: list[Row], note: str, stress: list[Row]) -> str:
    lines = [TORCH_BEGIN, "## PyTorch CPU (correct)", "",
             f"Measured by `{command}` (Python {platform.python_version()}, NumPy {np.__version__}, {platform.machine()}). "
             + note, "",
             *correct_summary("PyTorch CPU (correct)", rows),
             *(correct_summary("Stress, PyTorch CPU (correct)", stress) if stress else []), ""]
    if rows:
        lines += [table(rows), ""]
    if stress:
        lines += ["### Stress: diff_dst with |mean| >> sd", "", table(stress), ""]
    return "\n".join(lines + [TORCH_END])


def kept_torch_block(previous: Path, note: str) -> str:
    """The PyTorch rows of the table at `previous` as they stand, or a block that says none were measured."""
    old = previous.read_text() if previous.is_file() else ""
    if TORCH_BEGIN in old and TORCH_END in old:
        return old[old.index(TORCH_BEGIN):old.index(TORCH_END) + len(TORCH_END)]
    return "\n".join([TORCH_BEGIN, "## PyTorch CPU (correct)", "", f"No PyTorch rows: {note}", "", TORCH_END])


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"smaller grid: M in {QUICK_M}, no ResNet-size PyTorch runs, no stress section")
    parser.add_argument("--write", action="store_true", help="also write the tables to --out")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where --write writes (default %(default)s)")
    parser.add_argument("--seed", type=int, default=20240607)
    parser.add_argument("--m", help="the zoo's grid of elements per channel, comma-separated (default: by --quick)")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch rows")
    parser.add_argument("--no-stress", action="store_true", help="skip the stress section (large dy_offset, large M)")
    parser.add_argument("--verbose", "-v", action="store_true", help="one line per run on stderr as it finishes")
    args = parser.parse_args(argv)

    def log(row: Row) -> None:
        if args.verbose:
            print(f"{time.perf_counter() - start:7.1f}s {row.describe()} {fmt_verdict(row)} "
                  f"units {_units_text(row.worst_units)}", file=sys.stderr, flush=True)

    start = time.perf_counter()
    m_grid = tuple(int(m) for m in args.m.split(",")) if args.m else QUICK_M if args.quick else FULL_M
    if args.no_torch:
        torch_rows, torch_note = [], "PyTorch rows skipped (--no-torch)."
    else:
        torch_rows, torch_note = run_torch(np.random.default_rng([args.seed, 1]), args.quick, log)
    t_torch = time.perf_counter() - start
    correct, bugs, noops = run_zoo(np.random.default_rng([args.seed, 2]), m_grid, log)
    t_zoo = time.perf_counter() - start - t_torch
    stress_rows, stress_note = [], ""
    if not (args.quick or args.no_stress):
        stress_rows, stress_note = run_stress(np.random.default_rng([args.seed, 3]), log, use_torch=not args.no_torch)
    elapsed = time.perf_counter() - start

    command = "python -m tools.calibrate_tolerances" + (" --quick" if args.quick else "") + (
        f" --seed {args.seed}" if args.seed != parser.get_default("seed") else "") + (
        f" --m {args.m}" if args.m else "") + (" --no-torch" if args.no_torch else "") + (
        " --no-stress" if args.no_stress and not args.quick else "")
    zoo_stress = [r for r in stress_rows if r.group == "zoo"]
    torch_stress = [r for r in stress_rows if r.group == "torch"]
    el_bugs = [r for r in bugs if r.reason == "elements"]
    worst_grid = max((r.worst_units for r in correct), default=math.nan)
    worst_stress = max((r.worst_units for r in zoo_stress), default=math.nan)
    mildest_bug = min((r.failing_units for r in el_bugs), default=math.nan)
    headline = (f"**Summary** (the NumPy zoo; PyTorch's rows below): {k_text()}. Correct kernels on the grid: worst "
                f"{_units_text(worst_grid)} units, {failures(correct)}"
                + (f"; in the stress section: worst {_units_text(worst_stress)} units, {failures(zoo_stress)}"
                   if zoo_stress else "")
                + f". Planted bugs: mildest element-wise failure {_units_text(mildest_bug)} units, "
                f"{sum(r.passed for r in bugs)} of {len(bugs)} PASS.")
    if torch_rows or torch_stress:
        torch_part = torch_block(command, torch_rows, torch_note, torch_stress)
    else:
        torch_part = kept_torch_block(args.out, torch_note)
    doc = [
        "# Error-model calibration table",
        "",
        f"Generated by `{command}` (seed {args.seed}; Python {platform.python_version()}, NumPy {np.__version__}, "
        f"{platform.machine()}). Do not edit by hand: rerun the script with `--write` (tests/test_tools.py checks "
        "that the rules and every row's verdict marks agree with the judge's current K).",
        "",
        rules_paragraph(),
        "",
        headline,
        "",
        *correct_summary("NumPy zoo (correct)", correct),
        *bug_summary(bugs, noops),
        *(correct_summary("Stress, NumPy zoo (correct)", zoo_stress) if zoo_stress else []),
        "",
        torch_part,
        "",
        "## NumPy kernel zoo (correct)",
        "",
        f"tools/zoo.py float32 kernels, orders {', '.join(zoo.ORDERS)}; {CHANNELS} channels; NCX = NCHW, NXC = NHWC. "
        "Harder data (|mean|/sd ~ 1e3, diff_dst offset 100) at the two largest M.",
        "",
        table(correct),
        "",
        "## Planted bugs",
        "",
        "tools/zoo.py bugs on the same problems (sequential order), skipping problems where a bug's outputs are "
        "bit-identical to the correct kernel's. `nhwc-as-nchw` runs on NHWC problems with C == H.",
        "",
        table(bugs),
        "",
    ]
    if zoo_stress:
        doc += ["## Stress: diff_dst with |mean| >> sd (correct kernels)", "", stress_note, "", table(zoo_stress), ""]
    text = "\n".join(doc)
    print(text)
    t_stress = elapsed - t_torch - t_zoo
    print(f"runtime: {elapsed:.1f} s (torch {t_torch:.1f} s, zoo {t_zoo:.1f} s, stress {t_stress:.1f} s)",
          file=sys.stderr)
    if args.write:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
