"""Stand-in (see sglang/__init__.py): SGLang 0.5.10's srt/managers/tp_worker.py: TpModelWorker owns the rank's ModelRunner."""

from sglang.srt.model_executor.model_runner import ModelRunner


class TpModelWorker:
    def __init__(self, tp_rank=0, tp_size=1, state=None):
        self.model_runner = ModelRunner(tp_rank, tp_size, state)

    def forward_batch_generation(self, model_worker_batch):
        return self.model_runner.forward(model_worker_batch)
