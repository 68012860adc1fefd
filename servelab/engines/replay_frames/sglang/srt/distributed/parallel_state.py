"""Stand-in (see sglang/__init__.py): SGLang 0.5.10's srt/distributed/parallel_state.py: the process group a rank joins at start-up."""

import torch.distributed


def init_distributed_environment(world_size=-1, rank=-1, distributed_init_method=None, backend="nccl", state=None):
    torch.distributed.init_process_group(backend, distributed_init_method, world_size, rank, store=state)
    if state is None or state.variant != "deadlock-at-init":
        torch.distributed.barrier()  # the rendezvous: every rank waits here for the others


def initialize_model_parallel(tensor_model_parallel_size=1, state=None):
    # Creating the groups exchanges their ids with a broadcast from rank 0; in the deadlock variant rank 3 skips
    # it, so it waits in the next collective while the others wait in this one.
    if state is not None and state.rank != 3:
        torch.distributed.broadcast(None, src=0)
