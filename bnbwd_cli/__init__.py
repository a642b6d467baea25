"""bnbwd: the batch-normalization training backward pass as a command-line reference, and from Python.

    import bnbwd_cli
    grads = bnbwd_cli.backward(src, diff_dst, mean, variance, gamma, epsilon=1e-5, data_format="NCHW")
    bnbwd_cli.assert_backward_close(my_kernel_outputs, src=src, diff_dst=diff_dst, mean=mean,
                                    variance=variance, gamma=gamma, epsilon=1e-5, data_format="NCHW")

The functions live in bnbwd_cli/api.py, imported on first use: `import bnbwd_cli` (and so the
`bnbwd` command's start-up) loads nothing heavy.
InputError (a ValueError) is what a bad input raises, with the message the command line prints.
"""

from bnbwd_cli._version import __version__ as __version__  # re-exported: the package's version
from bnbwd_cli.errors import InputError

__all__ = ["Case", "InputError", "NumbaFallbackWarning", "Report", "assert_backward_close", "backward", "cases", "check"]


def __getattr__(name: str):
    if name in __all__:
        from bnbwd_cli import api

        return getattr(api, name)
    raise AttributeError(f"module 'bnbwd_cli' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
