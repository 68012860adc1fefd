"""torch.distributed's collectives as blocking waits (the module path py-spy shows is the real one)."""

from torch.distributed.distributed_c10d import all_reduce, broadcast

__all__ = ["all_reduce", "broadcast"]
