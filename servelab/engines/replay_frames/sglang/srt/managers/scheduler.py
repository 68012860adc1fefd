"""Stand-in (see sglang/__init__.py): SGLang 0.5.10's srt/managers/scheduler.py: one scheduler process per TP rank, its start-up and its request loop."""

from sglang.srt.managers.tp_worker import TpModelWorker


class Scheduler:
    def __init__(self, tp_rank, tp_size, state):
        self.tp_rank, self.tp_size, self.state = tp_rank, tp_size, state
        self.init_model_worker()

    def init_model_worker(self):
        self.tp_worker = TpModelWorker(self.tp_rank, self.tp_size, self.state)

    def recv_requests(self):
        """Rank 0 polls the tokenizer's socket and broadcasts what came; the replay's wait for work."""
        if self.state.in_phase("warmup", "decode-hang"):
            return ["batch"]
        self.state.wait_while("serve", "ready", timeout=1.0)
        return []

    def run_batch(self, batch):
        return self.tp_worker.forward_batch_generation(batch)

    def event_loop_overlap(self):
        while True:
            recv_reqs = self.recv_requests()
            if recv_reqs:
                self.run_batch(recv_reqs)


def run_scheduler_process(state):
    scheduler = Scheduler(state.rank, state.tp, state)
    scheduler.event_loop_overlap()
