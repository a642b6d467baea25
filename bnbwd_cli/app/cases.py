"""`bnbwd cases`: a suite of input bundles chosen to expose batch-norm backward bugs, and its manifest.

Pure apart from writing the suite (through files/suite.py): no click, no printing; progress goes
through the callback the caller passes. Each case is NAME.npz (src, diff_dst, mean, variance, gamma,
0-d epsilon and data_format), for a kernel to read and answer with NAME.out.npz beside it; the
manifest (manifest.txt, one line per case, and manifest.json) says which bug classes each case
targets and why its data exposes them. The same settings write the same bytes (case_values.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bnbwd_cli._version import __version__
# BUG_CLASSES and the ResNet-50 shapes: part of this module's names (the CLI's help, tools and tests read them here)
from bnbwd_cli.app.case_catalogue import (BUG_CLASSES, DEFAULT_CASES, FLOAT32_ONLY, RESNET50_BATCH,  # noqa: F401
                                          RESNET50_LAYERS, SIXTEEN_BIT_ONLY, CaseSpec, generated_case, resnet50_cases)
from bnbwd_cli.app.case_values import draw
from bnbwd_cli.dtypes import dtype_from_name
from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files import suite as suite_files
from bnbwd_cli.layout import FORMAT_ALIASES, canonical_format
from bnbwd_cli.render.json import document_text


DTYPES = ("f32", "bf16", "f16")  # short names, as dtype_from_name reads them
PRESETS = ("default", "tiny", "resnet50")
TINY_ELEMENTS = 4096  # the tiny preset: the default cases of at most this many elements per tensor
STATS_DTYPE = np.float32
INPUT_NAMES = ("src", "diff_dst", "mean", "variance", "gamma")  # a case's arrays; its bundle adds epsilon, data_format
MANIFEST_TEXT = "manifest.txt"
MANIFEST_JSON = "manifest.json"
GENERATED_ELEMENTS = 20_000  # --count's cases: at most this many elements per tensor unless --max-elements says
MIN_GENERATED_ELEMENTS = 64  # a smaller cap leaves too few shapes to draw from


@dataclass(frozen=True)
class SuiteSettings:
    """What `bnbwd cases` was asked for: data dtype (f32, bf16, f16), layout (NCX, NXC or an alias; one that
    fixes a rank, such as NCHW, keeps only the cases of that rank), preset, a cap on the suite's bytes; and
    `count` cases generated from `seed` after the preset's, of at most `max_elements` elements each."""

    dtype: str = "f32"
    data_format: str = "NCX"
    preset: str = "default"
    max_bytes: int | None = None
    seed: int = 0
    count: int = 0
    max_elements: int = GENERATED_ELEMENTS


@dataclass(frozen=True)
class WrittenCase:
    spec: CaseSpec
    file: str
    stored_shape: tuple[int, ...]
    nbytes: int
    sha256: str
    targets: tuple[str, ...]


@dataclass(frozen=True)
class Suite:
    """What was written: the cases, and the ones left out with the reason."""

    settings: SuiteSettings
    cases: tuple[WrittenCase, ...] = ()
    left_out: tuple[tuple[str, str], ...] = field(default=())

    @property
    def nbytes(self) -> int:
        return sum(case.nbytes for case in self.cases)


def catalogue(preset: str) -> tuple[CaseSpec, ...]:
    if preset == "default":
        return DEFAULT_CASES
    if preset == "tiny":
        return tuple(case for case in DEFAULT_CASES if case.elements <= TINY_ELEMENTS)
    if preset == "resnet50":
        return resnet50_cases()
    raise BnbwdError(f"preset {preset!r}: expected one of {', '.join(PRESETS)}")


def suite_specs(settings: SuiteSettings) -> tuple[CaseSpec, ...]:
    """The suite's cases in order: the preset's, then `count` generated ones (at the layout's rank if it fixes
    one). What `bnbwd cases` writes and the Python API's cases() yields."""
    if settings.dtype not in DTYPES:
        raise BnbwdError(f"dtype {settings.dtype!r}: expected one of {', '.join(DTYPES)}")
    canonical_format(settings.data_format)  # an unknown name fails before any work
    if settings.count < 0 or settings.seed < 0:
        raise BnbwdError(f"count {settings.count}, seed {settings.seed}: expected numbers >= 0")
    if settings.count and settings.max_elements < MIN_GENERATED_ELEMENTS:
        raise BnbwdError(f"max_elements {settings.max_elements}: expected at least {MIN_GENERATED_ELEMENTS}")
    rank = _rank(settings.data_format)
    generated = tuple(generated_case(settings.seed, index, settings.max_elements, rank)
                      for index in range(settings.count))
    return catalogue(settings.preset) + generated


def _rank(data_format: str) -> int | None:
    """The rank a layout's name fixes (NCHW: 4), or None (NCX, NXC)."""
    return FORMAT_ALIASES.get(data_format.upper(), (None, None))[1]


def left_out_by_rank(spec: CaseSpec, settings: SuiteSettings) -> str | None:
    """Why a layout that fixes a rank leaves this case out, or None."""
    rank = _rank(settings.data_format)
    if rank is not None and len(spec.shape) != rank:
        return f"rank {len(spec.shape)}: --format {settings.data_format} is rank {rank}"
    return None


def targets_for(spec: CaseSpec, dtype: str) -> tuple[str, ...]:
    left_out = SIXTEEN_BIT_ONLY if dtype == "f32" else FLOAT32_ONLY
    return tuple(t for t in spec.targets if t not in left_out)


def case_arrays(spec: CaseSpec, settings: SuiteSettings) -> dict[str, np.ndarray]:
    """The bundle of one case: inputs laid out in the suite's format, 0-d epsilon and data_format."""
    if settings.dtype not in DTYPES:
        raise BnbwdError(f"dtype {settings.dtype!r}: expected one of {', '.join(DTYPES)}")
    n, c, *spatial = spec.shape
    values = draw(spec.name, spec.recipe, (c, n, spec.positions), dtype_from_name(settings.dtype))
    layout = canonical_format(settings.data_format)
    return {"src": _lay_out(values.src, spec.shape, layout), "diff_dst": _lay_out(values.diff_dst, spec.shape, layout),
            "mean": values.mean.astype(STATS_DTYPE), "variance": values.variance.astype(STATS_DTYPE),
            "gamma": values.gamma.astype(STATS_DTYPE),
            "epsilon": np.array(spec.recipe.epsilon, np.float64), "data_format": np.array(layout)}


def case_members(spec: CaseSpec, settings: SuiteSettings) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The (shape, dtype) of each array case_arrays gives, without drawing a value (for --max-bytes)."""
    n, c, *spatial = spec.shape
    layout = canonical_format(settings.data_format)
    stored = spec.shape if layout == "NCX" else (n, *spatial, c)
    data = dtype_from_name(settings.dtype)
    return {"src": (stored, data), "diff_dst": (stored, data), "mean": ((c,), np.dtype(STATS_DTYPE)),
            "variance": ((c,), np.dtype(STATS_DTYPE)), "gamma": ((c,), np.dtype(STATS_DTYPE)),
            "epsilon": ((), np.dtype(np.float64)), "data_format": ((), np.array(layout).dtype)}


def _lay_out(values: np.ndarray, shape: tuple[int, ...], layout: str) -> np.ndarray:
    """(C, N, S) values -> (N, C, spatial...) for NCX, (N, spatial..., C) for NXC."""
    n, c, *spatial = shape
    if layout == "NCX":
        return np.ascontiguousarray(values.transpose(1, 0, 2)).reshape(shape)
    return np.ascontiguousarray(values.transpose(1, 2, 0)).reshape(n, *spatial, c)


Progress = Callable[[str, int, int], None]


def write_suite(settings: SuiteSettings, directory: Path, progress: Progress | None = None) -> Suite:
    """Write the suite to `directory` (absent or empty) all at once: it is built in a temporary sibling and
    renamed into place, so a failure or Ctrl-C leaves nothing. progress(name, done, total) after each case."""
    specs = suite_specs(settings)
    with suite_files.new_directory(directory) as building:
        written, left_out, total = [], [], 0
        for index, spec in enumerate(specs):
            wrong_rank = left_out_by_rank(spec, settings)
            if wrong_rank is not None:
                left_out.append((spec.name, wrong_rank))
                continue
            size = suite_files.npz_size(case_members(spec, settings))
            if settings.max_bytes is not None and total + size > settings.max_bytes:
                left_out.append((spec.name, f"{size} bytes: over --max-bytes {settings.max_bytes}"))
                continue
            arrays = case_arrays(spec, settings)
            data = suite_files.npz_bytes(arrays)
            (building / f"{spec.name}.npz").write_bytes(data)
            total += len(data)
            written.append(WrittenCase(spec, f"{spec.name}.npz", arrays["src"].shape, len(data),
                                       hashlib.sha256(data).hexdigest(), targets_for(spec, settings.dtype)))
            if progress is not None:
                progress(spec.name, index + 1, len(specs))
        if not written:
            raise BnbwdError(f"no case fits: {left_out[0][0]} is left out ({left_out[0][1]})" if left_out else "no case")
        suite = Suite(settings, tuple(written), tuple(left_out))
        (building / MANIFEST_TEXT).write_text(manifest_text(suite), encoding="utf-8")
        (building / MANIFEST_JSON).write_text(manifest_json(suite), encoding="utf-8")
    return suite


def manifest_text(suite: Suite) -> str:
    """One line per case: name, shape and M, the targets, why this data exposes them; then the left-out cases."""
    s = suite.settings
    lines = [f"# bnbwd {__version__} cases --preset {s.preset} --dtype {s.dtype} --format {s.data_format}"
             + (f" --max-bytes {s.max_bytes}" if s.max_bytes is not None else "")
             + (f" --seed {s.seed} --count {s.count} --max-elements {s.max_elements}" if s.count else ""),
             f"# {len(suite.cases)} cases, {suite.nbytes} bytes. Each NAME.npz holds src, diff_dst, mean, variance, "
             "gamma, epsilon, data_format; your kernel writes NAME.out.npz (diff_src, diff_gamma, diff_beta) beside it.",
             "# name | shape (stored), M | targets | why this data exposes them"]
    width = max(len(case.spec.name) for case in suite.cases)
    for case in suite.cases:
        shape = "x".join(map(str, case.stored_shape))
        lines.append(f"{case.spec.name:<{width}} | {shape}, M={case.spec.m} | {', '.join(case.targets) or '-'} | "
                     f"{case.spec.why}")
    for name, why in suite.left_out:
        lines.append(f"# left out: {name} ({why})")
    lines.append("# targets: " + "; ".join(f"{key}: {text}" for key, text in BUG_CLASSES.items()))
    return "\n".join(lines) + "\n"


def manifest_json(suite: Suite) -> str:
    """The manifest for programs: settings, the bug classes, each case's file, shape, targets, hash."""
    s = suite.settings
    document = {
        "tool": "bnbwd cases",
        "bnbwd_version": __version__,
        "settings": {"preset": s.preset, "dtype": s.dtype, "data_format": canonical_format(s.data_format),
                     "max_bytes": s.max_bytes, "seed": s.seed, "count": s.count, "max_elements": s.max_elements},
        "bug_classes": BUG_CLASSES,
        "cases": [{"name": c.spec.name, "file": c.file, "shape": list(c.stored_shape), "m": c.spec.m,
                   "channels": c.spec.shape[1], "epsilon": c.spec.recipe.epsilon, "targets": list(c.targets),
                   "why": c.spec.why, "bytes": c.nbytes, "sha256": c.sha256} for c in suite.cases],
        "left_out": [{"name": name, "why": why} for name, why in suite.left_out],
    }
    return document_text(document)
