"""The click layer: `main` is the `bnbwd` group (`from bnbwd_cli.cli import main`).

main.py holds the group (exit codes, signals, error lines, and which module holds each command), params.py
every ParamType and shared option, and run.py, verify.py, check.py one command each. A command's module is
imported when that command is looked up, so `bnbwd run` does not pay for verify's and check's imports.
"""

from bnbwd_cli.cli.main import main

__all__ = ["main"]
