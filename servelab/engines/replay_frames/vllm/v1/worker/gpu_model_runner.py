"""Stand-in (see vllm/__init__.py): vLLM 0.33's vllm/v1/worker/gpu_model_runner.py: GPUModelRunner."""

import torch.distributed

from vllm.model_executor.model_loader import get_model


class GPUModelRunner:
    def __init__(self, state):
        self.state = state

    def load_model(self):
        self.model = get_model(state=self.state)
        self.state.wait_while("load")

    def _dummy_run(self, num_tokens):
        self.state.wait_while("kv", timeout=0.05)

    def profile_run(self):
        while self.state.in_phase("kv") or self.state.frozen:
            self._dummy_run(8192)

    def capture_model(self):
        while self.state.in_phase("graph") or self.state.frozen:
            self._capture_cudagraphs()

    def _capture_cudagraphs(self):
        self.state.wait_while("graph", timeout=0.05)

    def execute_model(self, scheduler_output):
        if self.state.in_phase("decode-hang"):
            # hang-in-decode: one rank took another branch; it all-reduces while the others wait for a broadcast
            if self.state.rank == 3:
                torch.distributed.all_reduce([0.0])
            else:
                torch.distributed.broadcast([0.0], src=0)
        total = 0
        for i in range(2000):
            total += i
        self.state.wait_while("warmup", timeout=0.005)
        return total
