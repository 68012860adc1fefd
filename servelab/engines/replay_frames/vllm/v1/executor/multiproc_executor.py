"""Stand-in (see vllm/__init__.py): vLLM 0.33's vllm/v1/executor/multiproc_executor.py: the engine core's executor and its worker processes."""

from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
from vllm.v1.worker.gpu_worker import Worker


class WorkerProc:
    def __init__(self, state):
        self.state = state
        self.worker = Worker(state.rank, state.tp, state)
        self.worker.init_device()
        self.worker.load_model()
        self.rpc_broadcast_mq = MessageQueue(state)

    @staticmethod
    def worker_main(state):
        worker = WorkerProc(state)
        worker.worker_busy_loop()

    @staticmethod
    def wait_for_ready(state):
        state.wait_while("init", "load")  # each worker's READY message on its pipe

    def worker_busy_loop(self):
        """The engine core's calls, as its phases make them: profile, capture, then one step per batch."""
        while True:
            method = self.rpc_broadcast_mq.dequeue()
            if method == "kv":
                self.worker.determine_available_memory()
            elif method == "graph":
                self.worker.compile_or_warm_up_model()
            elif method in ("warmup", "decode-hang"):
                self.worker.execute_model(None)


def worker_main(state):
    WorkerProc.worker_main(state)


class MultiprocExecutor:
    def __init__(self, state):
        self.state = state
        self._init_executor()

    def _init_executor(self):
        WorkerProc.wait_for_ready(self.state)

    def collective_rpc(self, method):
        self.state.wait_while(method)  # every worker answers when its call returns

    def execute_model(self, scheduler_output):
        return self.collective_rpc("decode-hang")  # the workers' outputs: none comes while they hang
