"""Stand-in package (see torch/__init__.py): torch.distributed's collectives live in distributed_c10d."""

from torch.distributed.distributed_c10d import all_reduce, barrier, broadcast, init_process_group  # noqa: F401
