"""Residency planning: score sections from traffic, select the resident set, render the prefix."""
