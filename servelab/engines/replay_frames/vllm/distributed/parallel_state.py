"""Stand-in (see vllm/__init__.py): vLLM 0.33's vllm/distributed/parallel_state.py."""

import torch.distributed


def init_distributed_environment(world_size=-1, rank=-1, distributed_init_method="env://", local_rank=-1,
                                 backend="nccl", state=None):
    torch.distributed.init_process_group(backend, distributed_init_method, world_size, rank, store=state)
    if state is None or state.variant != "deadlock-at-init":
        torch.distributed.barrier()


def ensure_model_parallel_initialized(tensor_model_parallel_size=1, state=None):
    if state is not None and state.rank != 3:
        torch.distributed.broadcast(None, src=0)
    else:
        torch.distributed.all_reduce([0])
