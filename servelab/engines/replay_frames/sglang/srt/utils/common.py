"""Stand-in (see sglang/__init__.py): SGLang 0.5.10's srt/utils/common.py."""

import torch.distributed


def get_available_gpu_memory(device="cuda", gpu_id=0, distributed=False, cpu_group=None):
    if distributed:
        torch.distributed.all_reduce([0.0], group=cpu_group)  # the minimum over the ranks
    return 138.72
