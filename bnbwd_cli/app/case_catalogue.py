"""The cases `bnbwd cases` can write, before their values: the bug classes a case may target, the default and
ResNet-50 presets' cases, and the generated ones (a shape and a recipe drawn from a counter-based stream keyed by
seed and index), each a CaseSpec (name, logical shape, targets, why, recipe). app/cases.py makes suites of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bnbwd_cli.app.case_values import Recipe, stream_key, uniform

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
RESNET50_BATCH = 4


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


def resnet50_cases() -> tuple[CaseSpec, ...]:
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
