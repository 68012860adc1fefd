"""vLLM's worker loop (vllm/v1/executor/multiproc_executor.py WorkerProc.worker_busy_loop): waits in the
shared-memory message queue for the next call."""

from vllm.distributed.device_communicators.shm_broadcast import MessageQueue


class WorkerProc:
    def __init__(self):
        self.rpc_broadcast_mq = MessageQueue()

    def worker_busy_loop(self):
        while True:
            self.rpc_broadcast_mq.dequeue(indefinite=True)
