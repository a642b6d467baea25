"""The package version: a leaf, so that what needs it (the CLI's --version, numba's cache directory) reaches no module above."""

__version__ = "0.1.0"
