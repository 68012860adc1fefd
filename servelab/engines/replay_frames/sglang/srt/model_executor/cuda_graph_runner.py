"""Stand-in (see sglang/__init__.py): SGLang 0.5.10's srt/model_executor/cuda_graph_runner.py: CudaGraphRunner captures one graph per batch size."""


class CudaGraphRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.capture_bs = [512, 256, 128, 64, 32, 16, 8, 4, 2, 1]
        self.capture()

    def capture(self):
        state = self.model_runner.state
        while state.in_phase("graph") or state.frozen:
            for bs in self.capture_bs:
                self.capture_one_batch_size(bs)
                if not state.in_phase("graph"):
                    break

    def capture_one_batch_size(self, bs):
        self.model_runner.state.wait_while("graph", timeout=0.05)
