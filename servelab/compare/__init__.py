"""Comparing runs: key figures side by side, bootstrap intervals, verdicts, comparability warnings."""
