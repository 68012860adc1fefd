"""Human-facing output: the live start-up view and, later, the run report."""
