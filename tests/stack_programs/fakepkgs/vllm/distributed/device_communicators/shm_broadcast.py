"""vLLM's shared-memory broadcast queue (MessageQueue.dequeue -> acquire_read): here a wait nobody ends."""

import threading


class MessageQueue:
    def __init__(self):
        self._written = threading.Event()

    def dequeue(self, indefinite=False):
        return self.acquire_read()

    def acquire_read(self):
        self._written.wait()
