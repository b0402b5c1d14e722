"""`python -m stepwarden`: the command line, as `stepwarden`."""

from .cli import main

main()
