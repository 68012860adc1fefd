"""Experiments: a file of cells (engines to launch, or servers already running) measured in turn, then compared."""
