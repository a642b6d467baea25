from bnbwd_cli.cli import main

main(prog_name="bnbwd")
