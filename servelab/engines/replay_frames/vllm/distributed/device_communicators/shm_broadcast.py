"""Stand-in (see vllm/__init__.py): vLLM 0.33's vllm/distributed/device_communicators/shm_broadcast.py: the shared-memory queue that carries the engine
core's calls to its workers."""


class MessageQueue:
    def __init__(self, state):
        self.state = state

    def acquire_read(self, timeout=None):
        self.state.wait_while("serve", "ready", timeout=1.0)  # nothing to run yet

    def dequeue(self, timeout=None):
        self.acquire_read(timeout)
        return self.state.phase
