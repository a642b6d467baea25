"""The click layer: `main` is the `bnbwd` group, with run, verify and check added (`from bnbwd_cli.cli import main`).

main.py holds the group (exit codes, signals, error lines), params.py every ParamType and shared option, and
run.py, verify.py, check.py one command each.
"""

from bnbwd_cli.cli.check import check, with_run_options
from bnbwd_cli.cli.main import main
from bnbwd_cli.cli.run import run
from bnbwd_cli.cli.verify import verify

main.add_command(verify)
main.add_command(with_run_options(check, run))
main.add_command(run)

__all__ = ["main"]
