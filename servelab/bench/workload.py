"""Kept for existing callers: the workloads now live in servelab/bench/workloads/ (one module per source)."""

from servelab.bench.workloads import (OutputSpec, SharedPrefixWorkload, SyntheticWorkload, Workload,
                                      load_dataset)

__all__ = ["OutputSpec", "SharedPrefixWorkload", "SyntheticWorkload", "Workload", "load_dataset"]
