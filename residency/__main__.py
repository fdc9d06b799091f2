"""`python -m residency` runs the CLI."""

from residency.cli import console_main

console_main()
