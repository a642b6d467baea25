"""A zoo of batch-norm backward kernels in plain NumPy: correct ones in float32 with different
accumulation orders, and the same kernel with planted bugs. Used by tests/test_zoo.py,
tools/bugs.py (the diagnosis's bug families, which draw this kernel's hooks) and the calibrations.

A correct kernel here does what PyTorch, TF and oneDNN do on a CPU: upcast reduced-precision inputs
to float32, compute invstd and xhat = (x - mean) * invstd in float32, reduce sum(dy) and
sum(dy * xhat) per channel in float32 in some order, write diff_src in float32 and round it once to
the input dtype; diff_gamma/diff_beta are rounded once to the parameters' dtype. A bug is a hook
(kernel's `hooks`, listed in HOOKS) that changes one step of it.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from bnbwd_cli.layout import view3

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.float32
ORDERS = ("sequential", "blocked", "pairwise", "float64-combine")
# The zoo's own named bugs: fixed instances of kernel's hooks (tools/bugs.py draws the hooks at random).
BUGS = (
    "missing-1/M", "sign-flip-one-channel", "per-sample-stats", "inference-in-training", "epsilon-1e-3",
    "unbiased-variance", "bf16-accumulation", "nhwc-as-nchw",
)


def make_problem(rng: np.random.Generator, shape, data_format: str, dtype, stats_dtype, *, epsilon: float = 1e-5,
                 center: float = 0.5, spread: float = 2.0, dy_offset: float = 0.0) -> dict:
    """Inputs of a training step: src with per-channel centres, diff_dst, the batch mean and
    (biased) variance of src computed in float64 and rounded to stats_dtype, gamma, epsilon."""
    axis = 1 if data_format == "NCX" else len(shape) - 1
    channels = shape[axis]
    centre_shape = [1] * len(shape)
    centre_shape[axis] = channels
    centres = rng.normal(center, 1.0, size=channels).reshape(centre_shape)
    spreads = rng.uniform(0.5, 1.5, size=channels).reshape(centre_shape) * spread
    src = (centres + spreads * rng.normal(size=shape)).astype(dtype)
    diff_dst = (dy_offset + rng.normal(size=shape)).astype(dtype)
    x64 = view3(src.astype(np.float32).astype(np.float64), data_format)
    mean = x64.mean(axis=(0, 2)) if x64.size else np.zeros(channels)
    variance = x64.var(axis=(0, 2)) if x64.size else np.ones(channels)
    return {
        "src": src,
        "diff_dst": diff_dst,
        "mean": mean.astype(stats_dtype),
        "variance": variance.astype(stats_dtype),
        "gamma": rng.uniform(0.5, 1.5, size=channels).astype(stats_dtype),
        "epsilon": epsilon,
        "data_format": data_format,
    }


def _per_channel(array: np.ndarray, data_format: str) -> np.ndarray:
    """(C, M) float32 copy, each row a channel's elements in storage order."""
    x3 = view3(array, data_format)
    return np.ascontiguousarray(x3.astype(np.float32).transpose(1, 0, 2).reshape(x3.shape[1], -1))


def _from_per_channel(rows: np.ndarray, like: np.ndarray, data_format: str) -> np.ndarray:
    shape3 = view3(like, data_format).shape
    return rows.reshape(shape3[1], shape3[0], shape3[2]).transpose(1, 0, 2).reshape(like.shape)


def channel_sums(terms: np.ndarray, order: str, block: int = 256, lost: dict | None = None) -> np.ndarray:
    """Per-row sums of a (C, M) float32 array in one of the orders real kernels use; ``lost`` (blocked
    orders): channel -> index of a block whose partial sum is dropped (a race)."""
    c, m = terms.shape
    if m == 0:
        return np.zeros(c, np.float32)
    if order == "sequential":  # one accumulator per channel, element by element
        return np.cumsum(terms, axis=1, dtype=np.float32)[:, -1]
    if order == "pairwise":  # NumPy's own float32 pairwise sum
        return terms.sum(axis=1, dtype=np.float32)
    pad = (-m) % block
    blocks = np.pad(terms, ((0, 0), (0, pad))).reshape(c, -1, block)
    partial = np.cumsum(blocks, axis=2, dtype=np.float32)[:, :, -1]  # sequential within a block
    for channel, index in (lost or {}).items():
        partial[channel, index] = 0
    if order == "blocked":  # block partials combined in float32, one after another
        return np.cumsum(partial, axis=1, dtype=np.float32)[:, -1]
    if order == "float64-combine":  # PyTorch CPU: float32 partials combined in float64
        return partial.astype(np.float64).sum(axis=1).astype(np.float32)
    raise ValueError(order)


def running16(terms: np.ndarray, dtype) -> np.ndarray:
    """Per-row sums with a 16-bit accumulator (the sum rounded to ``dtype`` after every addition)."""
    total = np.zeros(terms.shape[0], np.float32)
    for k in range(terms.shape[1]):
        total = (total + terms[:, k]).astype(dtype).astype(np.float32)
    return total


# Each hook is one bug; kernel(problem, hooks=...) applies them (tools/bugs.py's families draw them).
HOOKS = {
    "read_format": "NCX or NXC: the buffers read, and diff_src written, in this layout (a layout mix-up)",
    "swap_read": "'src' or 'diff_dst': that buffer read with H and W swapped",
    "swap_write": "diff_src written with H and W swapped",
    "dy16": "a 16-bit dtype: diff_dst rounded to it before use (a float32 kernel under autocast)",
    "dy_read_at": "(C,) ints: the elementwise pass reads channel c's diff_dst at index[c] (the sums use the right one)",
    "write_other_layout": "diff_src computed right but written in the other layout's order (NCHW order into an NHWC "
                          "buffer, or the reverse)",
    "epsilon": "this epsilon instead of the given one",
    "own_stats": "the batch's own mean and variance (float64) instead of the given ones",
    "invstd_given": "the variance input used as invstd (right when the inputs hold invstd)",
    "variance_as_invstd": "the variance input used as invstd (the bug)",
    "unbiased": "the variance scaled by M / (M - 1)",
    "stats16": "(dtype, 'mean' / 'invstd' / 'mean invstd'): those kept in a 16-bit dtype",
    "gamma": "'ignored', 'twice', 'next' or 'previous': gamma replaced by 1, gamma**2 or a neighbour's",
    "gamma_terms": "'x' or 'x - mean': diff_gamma summed from these instead of xhat",
    "gamma_terms_in_src": "False: diff_src uses the right sum of dy*xhat even when diff_gamma does not",
    "skip_tail": "the last t elements of each channel left out of the sums",
    "block": "the block size of a blocked sum (the order becomes 'blocked')",
    "lost": "channel -> block index: that block's partial sum lost (with 'block')",
    "accumulate16": "a dtype: the sums accumulated in it, element by element",
    "single_pass": "diff_gamma = (sum(dy*x) - mean*sum(dy)) * invstd",
    "divisor_one": "the sums not divided by M in diff_src",
    "no_mean_dy": "channels where diff_beta/M is not subtracted",
    "inference": "diff_src = gamma*invstd*diff_dst (inference's formula in training)",
    "per_sample": "sums over each sample's positions only (per-sample statistics)",
    "sample_groups": "G: diff_src from the sums over each of G contiguous groups of samples alone, divided by the "
                     "group's count (a data-parallel batch norm without its all-reduce); the sums written are whole",
    "flip": "channels whose diff_src is negated",
    "truncate": "16-bit outputs converted by truncation (round toward zero)",
    "unwritten": "channel -> None (left zero) or another channel (stale: that channel's values)",
    "sum_as_mean": "diff_beta and diff_gamma divided by M",
    "stats_used": "(mean, invstd), (C,) each: the statistics the kernel used instead of the given ones",
    "own_stats32": "'two-pass' or 'single-pass': the kernel's own float32 batch statistics, summed in storage order "
                   "(single-pass: the variance as E[x^2] - E[x]^2)",
    "coefficients": "(a, b, c), scalars or (C,): diff_src = k*(a*dy - b*mean(dy) - c*xhat*mean(dy*xhat))",
    "sum_factors": "output -> factor, scalar or (C,): diff_gamma or diff_beta written times it (diff_src uses the "
                   "true sums)",
    "sums_in_src": "True: diff_src computed from the sums as written (with sum_factors)",
    "written_as": "output -> the other sum's name: that sum written in its place",
    "dropped": "channel -> share: a random share of that channel's elements left out of both sums (diff_src uses "
               "those sums)",
    "read_at": "(param, index): gamma, mean, invstd or 'mean invstd' (both) of channel c read at index[c] ((C,) "
               "ints); 'invstd elementwise': invstd read there by the elementwise pass only",
    "param_axis": "(param, axis): gamma or mean indexed by that axis of a channel's (N, *spatial) elements",
    "subset_written": "(output, mask, twice, channels): as subset, for that sum as written only (diff_src uses the "
                      "whole sums)",
    "subset": "(mask, twice, channels): the (M,) bool mask of each channel's elements in storage order left out of "
              "the sums (twice: counted twice), in those channels (None: all)",
}


def named_hooks(bug: str, bad_channel: int = 0) -> dict:
    """The hooks of one of BUGS."""
    return {"missing-1/M": {"divisor_one": True}, "sign-flip-one-channel": {"flip": (bad_channel,)},
            "per-sample-stats": {"per_sample": True}, "inference-in-training": {"inference": True},
            "epsilon-1e-3": {"epsilon": 1e-3}, "unbiased-variance": {"unbiased": True},
            "bf16-accumulation": {"accumulate16": BF16},
            "nhwc-as-nchw": {"read_format": "NCX"}}[bug]  # an NHWC buffer read as NCHW (needs C == H)


def kernel(problem: dict, order: str = "sequential", bug: str | None = None, bad_channel: int = 0,
           hooks: dict | None = None) -> dict:
    """diff_src (dtype of src), diff_gamma, diff_beta (dtype of mean) as a float32 kernel summing in `order`
    computes them: a correct one, or with one of BUGS (`bug`) or any HOOKS (`hooks`) planted."""
    h = dict(hooks or {}, **(named_hooks(bug, bad_channel) if bug else {}))
    unknown = {key for key in h if not key.startswith("_")} - set(HOOKS)  # "_inputs": bugs.py's, not a hook
    if unknown:
        raise ValueError(f"unknown hooks {sorted(unknown)}: a misspelt bug would plant nothing")
    fmt = problem["data_format"]
    read_fmt = h.get("read_format", fmt)
    src, dy = problem["src"], problem["diff_dst"]
    if h.get("swap_read") == "diff_dst":
        dy = _swap_read(dy, fmt)
    if h.get("swap_read") == "src":
        src = _swap_read(src, fmt)
    x, g = _per_channel(src, read_fmt), _per_channel(dy, read_fmt)
    if "dy16" in h:  # diff_dst rounded to a 16-bit type before use (autocast)
        g = g.astype(h["dy16"]).astype(g.dtype)
    mean, invstd = _statistics(problem, x, h)
    gamma = problem["gamma"].astype(F32)
    if "gamma" in h:
        gamma = {"ignored": np.ones_like(gamma), "twice": gamma * gamma, "next": np.roll(gamma, -1),
                 "previous": np.roll(gamma, 1)}[h["gamma"]]
    elementwise_invstd = None  # invstd misread in the elementwise pass only (the sums use the right one)
    if "read_at" in h:
        param, index = h["read_at"]
        if param == "invstd elementwise":
            elementwise_invstd = invstd[index]
        else:
            gamma, mean, invstd = (v[index] if name in param.split() else v for name, v in
                                   (("gamma", gamma), ("mean", mean), ("invstd", invstd)))
    mean_at, k = mean[:, None], (gamma * invstd)[:, None]
    if "param_axis" in h:  # a per-channel value taken element by element along another axis
        param, axis = h["param_axis"]
        cshape = (src.shape[0], *src.shape[2:]) if read_fmt == "NCX" else (src.shape[0], *src.shape[1:-1])
        along = np.indices(cshape)[axis].reshape(1, -1)
        if param == "gamma":
            k = gamma[along] * invstd[:, None]
        else:
            mean_at = mean[along]
    xhat = (x - mean_at) * invstd[:, None]
    terms_g = {"xhat": g * xhat, "x": g * x, "x - mean": g * (x - mean[:, None])}[h.get("gamma_terms", "xhat")]
    order = "blocked" if "block" in h else order
    beta, gam = _sums(g, order, h), _sums(terms_g, order, h)
    if h.get("single_pass"):
        sxdy = np.cumsum(g * x, axis=1, dtype=F32)[:, -1]
        beta = np.cumsum(g, axis=1, dtype=F32)[:, -1]
        gam = (sxdy - mean * beta) * invstd
    gam_src = gam if h.get("gamma_terms_in_src", True) or h.get("gamma_terms", "xhat") == "xhat" else \
        _sums(g * xhat, order, dict(h, lost=None))
    factors = h.get("sum_factors", {})
    beta_out, gam_out = beta, gam
    if "subset_written" in h:  # one sum written from part of its reduction; diff_src uses the whole sums
        name, mask, twice, channels = h["subset_written"]
        part = dict(h, subset=(mask, twice, channels))
        if name == "diff_beta":
            beta_out = _sums(g, order, part)
        else:
            gam_out = _sums(terms_g, order, part)
    written_beta = (beta_out * np.asarray(factors.get("diff_beta", 1.0), np.float64)).astype(F32)
    written_gam = (gam_out * np.asarray(factors.get("diff_gamma", 1.0), np.float64)).astype(F32)
    if h.get("sums_in_src"):
        beta, gam_src = written_beta, written_gam
    if elementwise_invstd is not None:
        xhat, k = (x - mean_at) * elementwise_invstd[:, None], (gamma * elementwise_invstd)[:, None]
    g_src = g[np.asarray(h["dy_read_at"])] if "dy_read_at" in h else g  # dy of another channel, elementwise only
    diff_src = _diff_src((g_src, xhat, beta, gam_src), k, src.shape[0], h)
    for channel in h.get("flip", ()):
        diff_src[channel] = -diff_src[channel]
    written = _convert(diff_src, src.dtype, h.get("truncate", False))
    for channel, source in h.get("unwritten", {}).items():
        written[channel] = 0 if source is None else written[source]
    diff_src_out = _from_per_channel(written, src, read_fmt)
    if h.get("swap_write"):
        diff_src_out = _swap_write(diff_src_out, fmt)
    if h.get("write_other_layout"):  # the buffer filled in the other layout's order (its own shape kept)
        nd = diff_src_out.ndim
        order = (0, nd - 1, *range(1, nd - 1)) if fmt == "NXC" else (0, *range(2, nd), 1)
        diff_src_out = np.ascontiguousarray(diff_src_out.transpose(order)).reshape(diff_src_out.shape)
    beta, gam = written_beta, written_gam
    if h.get("sum_as_mean"):
        beta = beta / F32(x.shape[1])
    stats_dtype = problem["mean"].dtype
    sums = {"diff_gamma": gam, "diff_beta": beta}
    sums = {name: sums[h.get("written_as", {}).get(name, name)] for name in sums}
    return {"diff_src": diff_src_out,
            "diff_gamma": _convert(sums["diff_gamma"], stats_dtype, h.get("truncate", False)),
            "diff_beta": _convert(sums["diff_beta"], stats_dtype, h.get("truncate", False))}


def _statistics(problem: dict, x: np.ndarray, h: dict) -> tuple[np.ndarray, np.ndarray]:
    """The float32 mean and invstd the kernel uses."""
    m = x.shape[1]
    mean = problem["mean"].astype(F32)
    stat = problem["variance"].astype(F32)
    eps = F32(h.get("epsilon", problem["epsilon"]))
    if h.get("own_stats"):
        x64 = x.astype(np.float64)
        mean = x64.mean(axis=1).astype(F32)
        stat = x64.var(axis=1).astype(F32)
    if h.get("own_stats32"):
        count = F32(max(m, 1))
        mean = np.cumsum(x, axis=1, dtype=F32)[:, -1] / count
        if h["own_stats32"] == "single-pass":
            stat = np.cumsum(x * x, axis=1, dtype=F32)[:, -1] / count - mean * mean
        else:
            centred = x - mean[:, None]
            stat = np.cumsum(centred * centred, axis=1, dtype=F32)[:, -1] / count
    if h.get("invstd_given") or h.get("variance_as_invstd") or problem.get("variance_is_invstd"):
        invstd = stat
    else:
        variance = stat * F32(m / (m - 1)) if h.get("unbiased") and m > 1 else stat
        invstd = (F32(1) / np.sqrt(variance + eps)).astype(F32)
    if "stats_used" in h:
        mean, invstd = (np.asarray(v, np.float64).astype(F32) for v in h["stats_used"])
    if "stats16" in h:
        dtype, which = h["stats16"]
        if "mean" in which:
            mean = mean.astype(dtype).astype(F32)
        if "invstd" in which:
            invstd = invstd.astype(dtype).astype(F32)
    return mean, invstd


def _sums(terms: np.ndarray, order: str, h: dict) -> np.ndarray:
    if h.get("dropped"):
        terms = terms.copy()
        for channel, share in h["dropped"].items():  # the same elements for every sum: seeded by the channel
            terms[channel, np.random.default_rng(channel).random(terms.shape[1]) < share] = 0
    if h.get("accumulate16") is not None:
        return running16(terms, h["accumulate16"])
    if "subset" in h:
        mask, twice, channels = h["subset"]
        terms = terms.copy()
        rows = slice(None) if channels is None else list(channels)
        part = terms[rows]
        part[:, mask] *= F32(2) if twice else F32(0)
        terms[rows] = part
    kept = terms[:, : terms.shape[1] - h.get("skip_tail", 0)]
    return channel_sums(kept, order, h.get("block", 256), h.get("lost"))


def _diff_src(sums: tuple, k: np.ndarray, batch: int, h: dict) -> np.ndarray:
    """diff_src in float32 from (dy, xhat, diff_beta, the sum of dy*xhat it uses) and k = gamma*invstd."""
    g, xhat, beta, gam = sums
    c, m = g.shape
    if h.get("inference"):
        return k * g
    if h.get("per_sample") or h.get("sample_groups"):  # sums over each sample's (or group's) positions only
        parts = batch if h.get("per_sample") else h["sample_groups"]  # (rows are in (n, positions) order)
        gs, xs = g.reshape(c, parts, -1), xhat.reshape(c, parts, -1)
        per = F32(gs.shape[2])
        mean_dy = gs.sum(axis=2, keepdims=True, dtype=F32) / per
        mean_dyx = (gs * xs).sum(axis=2, keepdims=True, dtype=F32) / per
        return (k[:, :, None] * (gs - mean_dy - xs * mean_dyx)).reshape(c, m)
    divisor = F32(1) if h.get("divisor_one") else F32(max(m, 1))
    mean_dy = beta / divisor
    if "no_mean_dy" in h:
        mean_dy = mean_dy.copy()
        mean_dy[list(h["no_mean_dy"])] = 0
    a, b, c_ = (np.asarray(v, np.float64).astype(F32).reshape(-1, 1) for v in h.get("coefficients", (1, 1, 1)))
    if "coefficients" in h:
        return k * (a * g - b * mean_dy[:, None] - c_ * xhat * (gam / divisor)[:, None])
    return k * (g - mean_dy[:, None] - xhat * (gam / divisor)[:, None])


def _convert(values: np.ndarray, dtype, truncate: bool) -> np.ndarray:
    """float32 -> dtype, to nearest; ``truncate``: 16-bit dtypes toward zero (float32 values are already there)."""
    out = values.astype(dtype)
    if not truncate or np.dtype(dtype) == np.dtype(np.float32):
        return out
    wider = np.abs(out.astype(np.float32)) > np.abs(values)
    bits = out.view(np.uint16).copy()
    bits[wider] -= np.uint16(1)  # one step toward zero in magnitude
    return bits.view(dtype)


def _swap_read(array: np.ndarray, fmt: str) -> np.ndarray:
    """The tensor read from ``array``'s buffer with H and W swapped."""
    shape = array.shape
    if fmt == "NCX":
        h, w = shape[-2:]
        return np.ascontiguousarray(array.reshape(*shape[:-2], w, h).swapaxes(-1, -2)).reshape(shape)
    h, w = shape[-3:-1]
    return np.ascontiguousarray(array.reshape(*shape[:-3], w, h, shape[-1]).swapaxes(-2, -3)).reshape(shape)


def _swap_write(array: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "NCX":
        return np.ascontiguousarray(array.swapaxes(-1, -2)).reshape(array.shape)
    return np.ascontiguousarray(array.swapaxes(-2, -3)).reshape(array.shape)


def inputs_of(problem: dict):
    """The judge's view of a problem."""
    from bnbwd_cli.core import Op

    return Op(problem["src"], problem["diff_dst"], problem["mean"], problem["variance"], problem["gamma"],
              epsilon=problem["epsilon"], data_format=problem["data_format"])


def bnbwd_outputs(problem: dict) -> dict:
    """bnbwd's own outputs (the NumPy core): the reference side a kernel's outputs are judged against."""
    from bnbwd_cli.core import Settings, backward

    result = backward(inputs_of(problem), Settings(core="numpy"))
    return {"diff_src": result.diff_src, "diff_gamma": result.diff_gamma, "diff_beta": result.diff_beta}


def exact_outputs(problem: dict) -> dict:
    """The float64 oracle's outputs (tests/oracle-grade: math.fsum sums)."""
    from bnbwd_cli.core import Op
    from bnbwd_cli.core.reference import reference_backward

    return reference_backward(Op(problem["src"], problem["diff_dst"], problem["mean"], problem["variance"], problem["gamma"],
                              epsilon=problem["epsilon"], data_format=problem["data_format"]))


def shape_for(m_target: int, channels: int, data_format: str, spatial_rank: int = 2) -> tuple[int, ...]:
    """A (N, C, H, W) or (N, H, W, C) shape with about m_target elements per channel."""
    if m_target <= 16:
        n, hw = m_target, (1,) * spatial_rank
    else:
        side = max(1, int(math.sqrt(m_target / 4)))
        n, hw = max(1, round(m_target / side**2)), (side,) * spatial_rank
    return (n, channels, *hw) if data_format == "NCX" else (n, *hw, channels)
