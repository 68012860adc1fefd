"""A model's forward pass: CPU work at a clock-varying depth (busy), or a collective that never completes."""

import time

import torch.distributed as dist


class LlamaForCausalLM:
    def __init__(self, rank, collective=None):
        self.rank = rank
        self.collective = collective

    def forward(self, step):
        if self.collective == "all_reduce":
            return dist.all_reduce([step])
        if self.collective == "broadcast":
            return dist.broadcast([step], src=0)
        return self._layer(1 + int(time.monotonic() * 10) % 11, step)

    def _layer(self, depth, step):
        if depth > 0:
            return self._layer(depth - 1, step)
        x = step
        for i in range(20000):
            x = (x * 31 + i) % 1000003
        time.sleep(0.001)
        return x
