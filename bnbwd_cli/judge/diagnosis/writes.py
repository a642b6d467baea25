"""Bugs in what reaches memory: channels never written, a sign flipped, a truncating conversion, output or
inputs with the spatial axes swapped, the other layout (buffers read in it, or diff_src written in its order), the
samples written in reverse order.

Tested by predicting the whole output under the bug (judge/diagnosis/assess.py), or for
truncation by its exact signature (every differing element one ulp toward zero).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from bnbwd_cli.dtypes import to_float64
from bnbwd_cli.judge.diagnosis.candidate import Candidate, channel_list, channel_ratio, percent, sixteen_bit_types
from bnbwd_cli.judge.diagnosis.case import Case
from bnbwd_cli.judge.diagnosis.prediction import Prediction
from bnbwd_cli.judge.diagnosis.kernels import Ingredients, backward_with
from bnbwd_cli.layout import view3



def candidates(case: Case) -> Iterator[Candidate]:
    if "diff_src" in case.outputs and case.outputs["diff_src"].suspicious:
        yield from _unwritten(case)
        yield from _sign_flips(case)
        yield from _spatial(case)
        yield from _layout(case)
        yield from _written_in_other_layout(case)
        yield from _samples_reversed(case)
    yield from _truncation(case)


def _unwritten(case: Case) -> Iterator[Candidate]:
    """Channels of diff_src that are all zeros, or an exact copy of another channel's output."""
    out = case.outputs["diff_src"]
    a, r = out.given, out.expected  # as written (zeros and copies are the same in float64)
    c = case.channels
    zero = ~np.any(a, axis=(0, 2)) & np.any(r, axis=(0, 2))
    copies: dict[int, int] = {}
    digests = {}
    for k in _alike(a):  # (only channels that may be copies are compared byte for byte)
        digests.setdefault(a[:, k].tobytes(), []).append(k)
    for same in digests.values():
        if len(same) > 1 and not zero[same[0]]:
            for k in same:  # which one holds its own values: the one matching its reference
                channel = (slice(None), k, slice(None))
                if not np.allclose(out.actual_at(channel), out.reference_at(channel), rtol=1e-2, atol=0):
                    copies[k] = next(j for j in same if j != k)
    hit = sorted(set(np.flatnonzero(zero).tolist()) | set(copies))
    if not hit:
        return
    a, r = out.actual, out.reference
    p = r.copy()
    p[:, hit] = a[:, hit]
    zeros = [k for k in hit if zero[k]]
    stale = [k for k in hit if k in copies]

    def text(assessment) -> str:
        parts = []
        if zeros:
            parts.append(f"all zeros in {channel_list(zeros)}")
        if stale:
            parts.append("another channel's values in " + ", ".join(f"c={k} (those of c={copies[k]})" for k in stale[:8]))
        return (f"diff_src of {len(hit)} of {c} channel(s) was never written: {'; '.join(parts)}; "
                f"every other channel matches within noise")

    yield Candidate("unwritten-channels", Prediction(diff_src=p), text, tuple(hit))


def _alike(a: np.ndarray) -> list[int]:
    """The channels of an (N, C, S) view whose bits sum to the same as another channel's (in ascending order): a
    channel that is a copy of another, bit for bit, is among them (a cheap first look before comparing bytes)."""
    bits = a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])
    fingerprint = bits.sum(axis=(0, 2), dtype=np.uint64)  # (wraps around on overflow: still equal for equal channels)
    _, inverse, counts = np.unique(fingerprint, return_inverse=True, return_counts=True)
    return [int(k) for k in np.flatnonzero(counts[inverse] > 1)]


def _sign_flips(case: Case) -> Iterator[Candidate]:
    ratio = channel_ratio(case)
    flipped = np.flatnonzero(np.abs(ratio + 1) < 0.05)
    if not flipped.size:
        return
    p = case.outputs["diff_src"].reference.copy()
    p[:, flipped] = -p[:, flipped]
    hit = tuple(int(k) for k in flipped)
    yield Candidate("sign-flip", Prediction(diff_src=p),
                    lambda s: f"sign flipped in channel(s) {channel_list(hit)}: actual = -reference there "
                              f"(explains {percent(s.share)} of the deviation)", hit)


def _swap_spatial(array: np.ndarray, fmt: str) -> np.ndarray | None:
    """The tensor a kernel sees when it reads ``array``'s buffer with its last two spatial axes swapped."""
    shape = array.shape
    if len(shape) < 4:
        return None
    if fmt == "NCX":
        h, w = shape[-2], shape[-1]
        if h == w:
            return None
        return np.ascontiguousarray(array.reshape(*shape[:-2], w, h).swapaxes(-1, -2)).reshape(shape)
    h, w = shape[-3], shape[-2]
    if h == w:
        return None
    return np.ascontiguousarray(array.reshape(*shape[:-3], w, h, shape[-1]).swapaxes(-2, -3)).reshape(shape)


def _unswap_spatial(array: np.ndarray, fmt: str) -> np.ndarray:
    """The inverse of _swap_spatial: the buffer a kernel writes when it writes with the axes swapped."""
    shape = array.shape
    if fmt == "NCX":
        return np.ascontiguousarray(array.swapaxes(-1, -2)).reshape(shape)
    return np.ascontiguousarray(array.swapaxes(-2, -3)).reshape(shape)


def _spatial(case: Case) -> Iterator[Candidate]:
    """H and W swapped (non-square images): in the output written, or in an input read."""
    fmt, shape = case.inputs.data_format, case.inputs.src.shape
    out = case.outputs["diff_src"]
    if len(shape) < 4 or (shape[-2] == shape[-1] if fmt == "NCX" else shape[-3] == shape[-2]):
        return  # (what _swap_spatial says: no two spatial axes, or square ones)
    full = _full(out.reference, shape, fmt)
    if _swap_spatial(full, fmt) is None:
        return
    axes = "H and W"
    # A swapped index is either side of the transpose: the kernel's (h, w) at the buffer's w*H + h, or the buffer's
    # (h, w) at the kernel's w*H + h; both permutations are tried, for the output written and for each input read.
    for permute in (_unswap_spatial, _swap_spatial):
        written = permute(full, fmt)
        yield Candidate("spatial-axes-swapped", Prediction(diff_src=view3(written, fmt)),
                        lambda s: f"diff_src was written with {axes} swapped (the reference transposed explains "
                                  f"{percent(s.share)} of the deviation)")
        for name in ("diff_dst", "src"):
            array = getattr(case.inputs, name)
            swapped = view3(permute(array.astype(np.float64), fmt), fmt)
            used = Ingredients(dy=swapped) if name == "diff_dst" else Ingredients(x=swapped)
            yield Candidate("spatial-axes-swapped", backward_with(case, used),
                            lambda s, name=name: f"the kernel read {name} with {axes} swapped (recomputed with it "
                                                 f"transposed: explains {percent(s.share)} of the deviation)")


def _full(array3: np.ndarray, shape: tuple[int, ...], fmt: str) -> np.ndarray:
    """An (N, C, S) view's data back in the tensor's own shape and layout."""
    if fmt == "NCX":
        return np.ascontiguousarray(array3).reshape(shape)
    return np.ascontiguousarray(array3.transpose(0, 2, 1)).reshape(shape)


def _layout(case: Case) -> Iterator[Candidate]:
    """The buffers read (and diff_src written) in the other layout, when that layout has C channels too."""
    fmt, shape = case.inputs.data_format, case.inputs.src.shape
    if len(shape) < 3:
        return
    other = "NCX" if fmt == "NXC" else "NXC"
    c_other = shape[1] if other == "NCX" else shape[-1]
    if c_other != case.channels:
        return
    x, dy = (view3(getattr(case.inputs, n).astype(np.float64), other) for n in ("src", "diff_dst"))
    moved = backward_with(case, Ingredients(x=x, dy=dy))
    if moved.diff_src is None:
        return

    def diff_src(rows: tuple):  # computed in the other layout's view, compared in this one's
        return tuple(view3(_full(v, shape, other), fmt)[rows] for v in (moved.of("diff_src"), moved.noise("diff_src")))

    names = {"NCX": "NCHW", "NXC": "NHWC"}
    # The same numbers arise when the kernel is right and the files are in the other layout than the one they
    # were judged in (a default, or a wrong --format): the hint names both.
    said = (f"the kernel read the {names[fmt]} tensors as {names[other]}, or the files hold {names[other]} tensors "
            f"judged as {names[fmt]} (recomputed that way")
    yield Candidate("layout-mixup", Prediction(diff_src, moved.diff_gamma, moved.diff_beta),
                    lambda s: f"{said}: explains {percent(s.share)} of the deviation); {names[other]} files: "
                              f"--format {names[other]}")


def _written_in_other_layout(case: Case) -> Iterator[Candidate]:
    """diff_src computed right and written in the other layout's order into this layout's buffer (an NHWC buffer
    filled in NCHW order): the reference, laid out in the other order, read back in this buffer's shape. Any shape
    (unlike a buffer read in the other layout, which needs C channels there too)."""
    fmt, shape = case.inputs.data_format, case.inputs.src.shape
    if len(shape) < 3 or math.prod(shape[2:] if fmt == "NCX" else shape[1:-1]) < 2:
        return
    nd = len(shape)
    order = (0, nd - 1, *range(1, nd - 1)) if fmt == "NXC" else (0, *range(2, nd), 1)
    reference = case.outputs["diff_src"].expected.reshape(-1)  # (the tensor's buffer in storage order)

    def diff_src(rows: tuple) -> tuple[np.ndarray, None]:
        # the buffer written is the reference transposed by ``order``, read back in this shape: its element at flat
        # position f is the transposed tensor's f-th, i.e. the reference's at the index whose order[k]-th entry is
        # the transposed index's k-th
        f = _flat_positions(case.shape, rows)
        moved = np.unravel_index(f, tuple(shape[k] for k in order))
        index = [None] * nd
        for k, axis in enumerate(order):
            index[axis] = moved[k]
        return to_float64(reference[np.ravel_multi_index(tuple(index), shape)]), None

    names = ("NCHW", "NHWC") if fmt == "NXC" else ("NHWC", "NCHW")
    yield Candidate("layout-mixup", Prediction(diff_src=diff_src),
                    lambda s: f"diff_src was written in {names[0]} order into the {names[1]} buffer: the right values "
                              f"at the wrong places (the reference so laid out explains {percent(s.share)} of the "
                              "deviation)")


def _samples_reversed(case: Case) -> Iterator[Candidate]:
    """diff_src computed right and written with the samples in reverse order (sample n at N-1-n: a loop or a grid
    index counted down): the reference's sample N-1-n at every element of sample n."""
    shape = case.inputs.src.shape
    if len(shape) < 2 or shape[0] < 2:
        return
    reference = case.outputs["diff_src"].expected.reshape(-1)

    def diff_src(rows: tuple) -> tuple[np.ndarray, None]:
        index = list(np.unravel_index(_flat_positions(case.shape, rows), shape))
        index[0] = shape[0] - 1 - index[0]
        return to_float64(reference[np.ravel_multi_index(tuple(index), shape)]), None

    yield Candidate("samples-reversed", Prediction(diff_src=diff_src),
                    lambda s: f"diff_src was written with its {shape[0]} samples in reverse order (sample n at "
                              f"n={shape[0] - 1}-n): the right values at the wrong places (the reference so reordered "
                              f"explains {percent(s.share)} of the deviation)")


def _flat_positions(shape: tuple[int, int, int], rows: tuple) -> np.ndarray:
    """Flat positions (n*C + c)*S + s in the buffer of the elements ``rows`` (slices or index arrays) select of an
    (N, C, S) view, in the shape view[rows] has."""
    axes = []
    for axis, (size, row) in enumerate(zip(shape, rows)):
        index = np.arange(size)[row] if isinstance(row, slice) else np.asarray(row)
        axes.append(index.reshape([-1 if k == axis else 1 for k in range(3)]) if isinstance(row, slice) else index)
    return (axes[0] * shape[1] + axes[1]) * shape[2] + axes[2]


def _toward_zero(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float64 values converted to a 16-bit ``dtype`` by truncation (round toward zero), back as float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        nearest = values.astype(dtype)
        farther = np.abs(nearest.astype(np.float64)) > np.abs(values)
        bits = nearest.view(np.uint16).copy()
        bits[farther] -= np.uint16(1)  # one step toward zero in magnitude
        return bits.view(dtype).astype(np.float64)


def _truncation(case: Case) -> Iterator[Candidate]:
    """A 16-bit output converted by truncation: the exact outputs (recomputed in float64) truncated to the
    output's dtype give the actual values, element for element (>= 99% of them: a float32 kernel's own
    rounding moves a few across a grid point), where correct rounding does not (>= 20% differ)."""
    exact = backward_with(case, Ingredients())
    for name, out in case.outputs.items():
        dtype = dict(sixteen_bit_types(short=True)).get(out.comparison.dtype)
        if dtype is None or not out.suspicious or out.actual.size < 16:
            continue
        p64 = exact.of(name)
        truncated = _toward_zero(p64, dtype)
        finite = np.isfinite(out.actual) & np.isfinite(truncated)
        same = float(np.mean(out.actual[finite] == truncated[finite]))
        nearest = float(np.mean(out.actual[finite] == p64[finite].astype(dtype).astype(np.float64)))
        if same >= 0.99 and nearest <= 0.8:
            text = (f"{name} was converted to {out.comparison.dtype} by truncation (round toward zero): the exact "
                    f"values truncated give {100 * same:.1f}% of its elements, rounded to nearest {100 * nearest:.0f}%")
            yield Candidate("truncating-conversion", Prediction(**{name: truncated}), lambda s, text=text: text)
