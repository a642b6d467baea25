"""`python -m bnbwd_cli` and the `bnbwd` script: Ctrl-C while the modules load is exit 130, no traceback."""

import sys


def entry() -> None:
    try:
        from bnbwd_cli.cli import main
    except KeyboardInterrupt:
        try:
            sys.stderr.write("error: interrupted; no partial output file is left\n")
        except (OSError, ValueError, AttributeError):
            pass
        sys.exit(130)  # errors.ExitCode.INTERRUPTED: importing it here could itself be interrupted
    main(prog_name="bnbwd")


if __name__ == "__main__":
    entry()
