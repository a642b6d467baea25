from bnbwd_cli.cli import main

main()
