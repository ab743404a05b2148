"""`python -m turnout` is the same as the `turnout` command."""

from turnout.cli import main

main()
