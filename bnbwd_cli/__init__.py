"""bnbwd: the batch-normalization training backward pass as a command-line reference."""

__version__ = "0.1.0"
