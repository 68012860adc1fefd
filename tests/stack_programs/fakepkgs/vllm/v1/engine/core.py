"""vLLM's engine core loop (vllm/v1/engine/core.py): run_busy_loop -> _process_input_queue, which blocks on the
input queue while there is no work."""

import queue


class EngineCoreProc:
    def __init__(self):
        self.input_queue = queue.Queue()

    def run_busy_loop(self):
        while True:
            self._process_input_queue()

    def _process_input_queue(self):
        return self.input_queue.get(block=True)
