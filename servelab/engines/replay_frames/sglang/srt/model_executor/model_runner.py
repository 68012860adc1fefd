"""Stand-in (see sglang/__init__.py): SGLang 0.5.10's srt/model_executor/model_runner.py: ModelRunner's start-up, in its order."""

import torch.distributed

from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner
from sglang.srt.model_loader import get_model
from sglang.srt.utils.common import get_available_gpu_memory


class ModelRunner:
    def __init__(self, tp_rank=0, tp_size=1, state=None):
        self.tp_rank, self.tp_size, self.state = tp_rank, tp_size, state
        self.initialize()

    def initialize(self):
        self.init_torch_distributed()
        self.load_model()
        self.init_memory_pool()
        if self.state.in_phase("graph"):
            self.init_device_graphs()

    def init_torch_distributed(self):
        init_distributed_environment(self.tp_size, self.tp_rank, "tcp://127.0.0.1:5000", "nccl", self.state)
        initialize_model_parallel(self.tp_size, self.state)
        return get_available_gpu_memory("cuda", self.tp_rank, distributed=self.tp_size > 1)

    def load_model(self):
        self.state.wait_while("init")
        self.model = get_model(state=self.state)
        self.state.wait_while("load")

    def init_memory_pool(self):
        self.state.wait_while("kv")

    def init_device_graphs(self):
        self.graph_runner = CudaGraphRunner(self)

    def forward(self, forward_batch):
        return self.forward_decode(forward_batch)

    def forward_decode(self, forward_batch):
        if self.state.in_phase("decode-hang"):
            # hang-in-decode: one rank took another branch; it all-reduces while the others wait for a broadcast
            if self.tp_rank == 3:
                torch.distributed.all_reduce([0.0])
            else:
                torch.distributed.broadcast([0.0], src=0)
        total = 0
        for i in range(2000):  # a little CPU, as a rank launching its kernels
            total += i
        self.state.wait_while("warmup", timeout=0.005)
        return total
