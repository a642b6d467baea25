"""`bnbwd cases`: a suite of input bundles chosen to expose batch-norm backward bugs, and its manifest.

Pure apart from writing the suite (through files/suite.py): no click, no printing; progress goes
through the callback the caller passes. Each case is NAME.npz (src, diff_dst, mean, variance, gamma,
0-d epsilon and data_format), for a kernel to read and answer with NAME.out.npz beside it; the
manifest (manifest.txt, one line per case, and manifest.json) says which bug classes each case
targets and why its data exposes them. The same settings write the same bytes (case_values.py).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bnbwd_cli._version import __version__
from bnbwd_cli.app.case_values import Recipe, draw, stream_key, uniform
from bnbwd_cli.dtypes import dtype_from_name
from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files import suite as suite_files
from bnbwd_cli.layout import FORMAT_ALIASES, canonical_format
from bnbwd_cli.render.json import document_text

# The bug classes a case can target: stable ids (the manifest's `targets`), one line each.
BUG_CLASSES = {
    "formula": "a wrong formula: a missing 1/M, a flipped sign, per-sample statistics, inference's formula in training",
    "layout_mixup": "a buffer read in the other layout (NHWC as NCHW or back)",
    "lost_partial": "one block's or warp's partial sum lost (a race) in some channels",
    "skipped_remainder": "the last partial block or a vector loop's remainder left out of the sums",
    "unwritten_channels": "diff_src of some channels never written (the last, partial channel tile)",
    "gamma_shift": "gamma off by one channel",
    "gamma_ignored": "gamma ignored (affine off)",
    "gamma_twice": "gamma applied twice",
    "x_for_xhat": "diff_gamma from x or x - mean instead of xhat",
    "mean_dy_not_subtracted": "the mean of diff_dst (diff_beta/M) not subtracted in diff_src",
    "variance_invstd": "the variance read as invstd, or invstd as the variance",
    "other_statistics": "the kernel's own batch statistics, or a mean/invstd kept in 16 bits, instead of the given ones",
    "swapped_spatial": "spatial axes swapped (H and W)",
    "sum16": "sums accumulated in a 16-bit type",
    "truncation": "16-bit outputs converted by truncation (round toward zero)",
    "epsilon": "a wrong or missing epsilon",
    "unbiased_variance": "an unbiased variance (divided by M - 1)",
    "cancellation": "a single-pass formula (sum of x*dy - mean * sum of dy) losing digits to cancellation",
}
# Targets a 16-bit suite does not claim: its data cannot resolve them (|mean|/sd is kept small enough for
# the 16-bit grid to resolve the spread, and a single-pass formula then loses fewer digits than the output has).
FLOAT32_ONLY = frozenset({"cancellation"})
# Targets a float32 suite does not claim: a float32 output truncated leans by half an ulp, within a correct
# kernel's own float32 rounding (docs/tolerances.md, "Truncation fails").
SIXTEEN_BIT_ONLY = frozenset({"truncation"})

DTYPES = ("f32", "bf16", "f16")  # short names, as dtype_from_name reads them
PRESETS = ("default", "tiny", "resnet50")
TINY_ELEMENTS = 4096  # the tiny preset: the default cases of at most this many elements per tensor
RESNET50_BATCH = 4
STATS_DTYPE = np.float32
INPUT_NAMES = ("src", "diff_dst", "mean", "variance", "gamma")  # a case's arrays; its bundle adds epsilon, data_format
MANIFEST_TEXT = "manifest.txt"
MANIFEST_JSON = "manifest.json"
GENERATED_ELEMENTS = 20_000  # --count's cases: at most this many elements per tensor unless --max-elements says
MIN_GENERATED_ELEMENTS = 64  # a smaller cap leaves too few shapes to draw from


@dataclass(frozen=True)
class CaseSpec:
    """A case before its values: name, logical shape (N, C, spatial...), the bug classes it targets, why."""

    name: str
    shape: tuple[int, ...]
    targets: tuple[str, ...]
    why: str
    recipe: Recipe = Recipe()

    @property
    def positions(self) -> int:
        return math.prod(self.shape[2:])

    @property
    def m(self) -> int:
        """Elements per channel."""
        return self.shape[0] * self.positions

    @property
    def elements(self) -> int:
        return self.shape[1] * self.m


def _case(name: str, shape: tuple[int, ...], targets: str, why: str, **recipe) -> CaseSpec:
    return CaseSpec(name, shape, tuple(targets.split()), why, Recipe(**recipe))


SUMS = "lost_partial skipped_remainder"
GAMMA = "gamma_shift gamma_ignored gamma_twice"
# Every case but gamma_ones has varied gamma and diff_dst with a nonzero mean per channel (so gamma bugs and
# a missing diff_beta/M show), src with |mean| and sd away from 0 and 1 (so x for xhat and variance read as
# invstd show); the list says what else each one adds.
DEFAULT_CASES = (
    _case("baseline", (3, 10, 10, 10),
          f"formula layout_mixup {GAMMA} x_for_xhat mean_dy_not_subtracted variance_invstd unwritten_channels "
          "epsilon unbiased_variance",
          "plain data; C = H = W = 10, so a buffer read in the other layout still fits the shapes; C not a multiple of 8"),
    _case("prime_m", (1, 19, 1009), f"{SUMS} unwritten_channels",
          "M = 1009 is prime: no block or vector width divides it; C = 19"),
    _case("block32_plus1", (3, 12, 43), SUMS, "M = 129 = 4*32 + 1: one element past the last full block of 32"),
    _case("block32_minus1", (1, 10, 127), SUMS, "M = 127 = 4*32 - 1: the last block of 32 is one short"),
    _case("block64_plus1", (1, 7, 257), SUMS, "M = 257 = 4*64 + 1 = 2*128 + 1 = 256 + 1"),
    _case("block64_minus1", (3, 9, 5, 17), f"{SUMS} swapped_spatial", "M = 255 = 4*64 - 1; H != W"),
    _case("block128_plus1", (5, 6, 7, 11), f"{SUMS} swapped_spatial", "M = 385 = 3*128 + 1; H != W"),
    _case("block128_minus1", (1, 5, 383), SUMS, "M = 383 = 3*128 - 1 (prime)"),
    _case("block256_plus1", (1, 13, 25, 41), f"{SUMS} swapped_spatial", "M = 1025 = 4*256 + 1 = 1024 + 1; N = 1, H != W"),
    _case("block256_minus1", (3, 11, 11, 31), f"{SUMS} swapped_spatial", "M = 1023 = 4*256 - 1; H != W"),
    _case("block1024_plus1", (7, 5, 439), f"{SUMS} sum16",
          "M = 3073 = 3*1024 + 1; 1-D; diff_dst's channel means take the running sums past 750, where bf16 "
          "steps by 4 and f16 by 0.5"),
    _case("block1024_minus1", (1, 3, 37, 83), f"{SUMS} swapped_spatial", "M = 3071 = 3*1024 - 1; N = 1, H != W"),
    _case("channels33", (4, 33, 5, 7), f"unwritten_channels gamma_shift {SUMS}",
          "C = 33 = 32 + 1: a tile of 8, 16 or 32 channels leaves one channel over"),
    _case("channels67", (2, 67, 3, 5), "unwritten_channels gamma_shift", "C = 67 (prime): every channel tile leaves some over"),
    _case("batch1", (1, 24, 29, 31), f"formula swapped_spatial {SUMS}", "N = 1, H = 29 != W = 31, M = 899"),
    _case("spatial_1x1", (67, 37, 1, 1), f"formula unwritten_channels {SUMS}",
          "1x1 images (after a global pool): the batch alone is reduced; N = M = 67, C = 37"),
    _case("nonsquare", (2, 6, 7, 13), "swapped_spatial formula", "H = 7 != W = 13: H and W swapped moves every element"),
    _case("spatial_1d", (4, 9, 61), f"formula {SUMS}", "1-D spatial (NCW): M = 244"),
    _case("spatial_3d", (2, 5, 3, 6, 11), f"formula swapped_spatial {SUMS}", "3-D spatial (NCDHW), D, H, W all different"),
    _case("no_spatial", (2, 6), "formula unbiased_variance", "rank 2 (N, C): M = 2, xhat = +-1, an unbiased variance is 2x"),
    _case("m7", (1, 5, 7), "unbiased_variance skipped_remainder",
          "M = 7: less than one vector of 8, all of it a remainder; an unbiased variance is 7/6 x"),
    _case("offset_mean", (4, 16, 9, 11), "cancellation other_statistics x_for_xhat variance_invstd",
          "|mean|/sd = 1e4 (f32; 100 in f16, 30 in bf16): a single-pass formula cancels digits away, statistics "
          "kept in 16 bits or recomputed in one pass are far off, x is far from xhat", centre="offset"),
    _case("tiny_variance", (4, 12, 8, 9), "epsilon variance_invstd unbiased_variance",
          "variances 1e-6 .. 1e-3 around epsilon = 1e-4: a wrong or missing epsilon moves invstd by up to 10x",
          centre="tiny", epsilon=1e-4),
    _case("gamma_some_zero", (4, 12, 6, 9), GAMMA,
          "gamma = 0 in every third channel (diff_src is exactly 0 there), varied elsewhere", gamma="some_zero"),
    _case("gamma_ones", (4, 12, 6, 9), "",
          "gamma = 1 exactly (a fresh layer): realistic; gamma bugs are invisible here by design", gamma="ones"),
    _case("gamma_near_one", (4, 12, 6, 9), "gamma_twice gamma_ignored",
          "gamma = 1 +- 0.02: gamma applied twice or ignored is off by up to 2%", gamma="near_one"),
    _case("relu_masked", (4, 24, 13, 9), "formula mean_dy_not_subtracted x_for_xhat truncation",
          "diff_dst is 0 where the forward output gamma*xhat + beta <= 0 (about half), as behind a ReLU",
          diff_dst="relu"),
    _case("global_avg_pool", (8, 40, 7, 7), "mean_dy_not_subtracted x_for_xhat gamma_shift truncation",
          "diff_dst of a global average pool behind a ReLU: one value per (n, c) over 7x7, /49", diff_dst="pool"),
    _case("coarse", (8, 16, 12, 10), "truncation formula",
          "src in steps of 1/4 and integer diff_dst: few distinct values, a correct kernel's roundings are correlated",
          coarse=True),
    _case("shifted_stats", (4, 8, 9, 10), "other_statistics variance_invstd",
          "mean and variance are running statistics, not this batch's: a kernel that recomputes them fails",
          stats="shifted"),
    _case("large_m", (1, 3, 313, 319), f"sum16 truncation {SUMS}",
          "M = 99847 ~ 1e5 with diff_dst means 1..3: running sums reach ~2e5, where a 16-bit accumulator stalls",
          diff_dst="rising"),
)

# ResNet-50's batch-norm layers (224x224 input; torchvision's v1.5, stride on the 3x3 convolution): (C, H).
RESNET50_LAYERS = ((64, 112), (64, 56), (128, 56), (256, 56), (128, 28), (256, 28), (512, 28), (256, 14),
                   (512, 14), (1024, 14), (512, 7), (2048, 7))


def _resnet50_cases() -> tuple[CaseSpec, ...]:
    cases = []
    for channels, side in RESNET50_LAYERS:
        last = (channels, side) == RESNET50_LAYERS[-1]
        shape = (RESNET50_BATCH, channels, side, side)
        m = RESNET50_BATCH * side * side
        targets = f"formula {GAMMA} x_for_xhat mean_dy_not_subtracted lost_partial truncation" + (" sum16" if m >= 50_000 else "")
        why = f"ResNet-50's BN at {channels}x{side}x{side}, batch {RESNET50_BATCH}: M = {m}" + (
            ", diff_dst of the global average pool" if last else ", diff_dst behind a ReLU")
        cases.append(_case(f"resnet50_c{channels}_{side}x{side}", shape, targets, why,
                           diff_dst="pool" if last else "relu"))
    return tuple(cases)


# A generated case's recipe: each field drawn from its list, the first entries likelier (plain data is the
# common case; the others are the data that exposes the bug classes their targets name).
_CENTRES = (("plain", ""), ("plain", ""), ("offset", "cancellation other_statistics x_for_xhat"),
            ("tiny", "epsilon variance_invstd"))
_DIFF_DSTS = (("plain", "mean_dy_not_subtracted"), ("relu", "mean_dy_not_subtracted x_for_xhat"),
              ("pool", "mean_dy_not_subtracted"), ("rising", ""))
_GAMMAS = (("varied", GAMMA), ("varied", GAMMA), ("ones", ""), ("near_one", "gamma_twice gamma_ignored"),
           ("some_zero", GAMMA))


def _pick(options: tuple, u: float):
    return options[min(int(u * len(options)), len(options) - 1)]


def generated_case(seed: int, index: int, max_elements: int, rank: int | None = None) -> CaseSpec:
    """Case `index` of seed `seed`: a shape (rank 2..5 unless `rank` is fixed, N 1..8, C 1..96, spatial sizes up
    to 64, at most `max_elements` elements, M >= 2) and a recipe drawn from a counter-based stream keyed by
    (seed, index) alone, so --count 10 is the first 10 cases of --count 500 and any machine draws the same."""
    u = uniform(stream_key("generated", str(seed), str(index)), 16).tolist()
    rank = rank or _pick((2, 3, 4, 4, 4, 5), u[0])
    n = 1 + int(u[1] * 8)
    c = 1 + int(96 ** u[2])  # log-uniform: few channels as likely as many
    spatial = [1 + int(64 ** u[3 + axis]) for axis in range(rank - 2)]
    while n * c * math.prod(spatial) > max_elements:  # shrink the largest extent until the case fits
        sizes = [n, c, *spatial]
        largest = sizes.index(max(sizes))
        sizes[largest] = max(1, sizes[largest] * 3 // 4)
        n, c, *spatial = sizes
    if n * math.prod(spatial) < 2:  # M = 1 has no variance to normalise by
        n = 2
    centre, centre_targets = _pick(_CENTRES, u[8])
    diff_dst, dy_targets = _pick(_DIFF_DSTS, u[9])
    gamma, gamma_targets = _pick(_GAMMAS, u[10])
    stats = "shifted" if u[11] < 0.15 else "batch"
    coarse = u[12] < 0.1 and centre == "plain"
    epsilon = 1e-4 if centre == "tiny" else _pick((1e-5, 1e-5, 1e-3), u[13])
    shape = (n, c, *spatial)
    m = n * math.prod(spatial)
    targets = " ".join(dict.fromkeys(
        f"formula {SUMS if m % 8 else ''} {centre_targets} {dy_targets} {gamma_targets} "
        f"{'other_statistics' if stats == 'shifted' else ''} {'truncation' if coarse else ''} "
        f"{'sum16' if diff_dst == 'rising' and m >= 4096 else ''}".split()))  # running sums past 16-bit steps
    why = (f"generated (seed {seed}): M = {m}, C = {c}; centre {centre}, diff_dst {diff_dst}, gamma {gamma}, "
           f"stats {stats}{', coarse' if coarse else ''}, epsilon {epsilon:g}")
    return _case(f"seed{seed}_{index:04d}", shape, targets, why, centre=centre, diff_dst=diff_dst, gamma=gamma,
                 stats=stats, coarse=coarse, epsilon=epsilon)


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
        return _resnet50_cases()
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
