"""Stand-in package (see the top package's docstring)."""
