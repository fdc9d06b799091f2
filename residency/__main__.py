"""`python -m residency` runs the CLI."""

from residency.cli import main

main()
