"""Stand-in (see vllm/__init__.py): vLLM 0.33's vllm/v1/engine/core.py: the engine core process, its start-up and its busy loop."""

import queue

from vllm.v1.executor.multiproc_executor import MultiprocExecutor


class EngineCore:
    def __init__(self, state):
        self.state = state
        self.model_executor = MultiprocExecutor(state)
        self._initialize_kv_caches()

    def _initialize_kv_caches(self):
        self.model_executor.collective_rpc("kv")  # determine_available_memory
        if self.state.in_phase("graph"):
            self.model_executor.collective_rpc("graph")  # compile_or_warm_up_model

    def step(self):
        if self.state.in_phase("decode-hang"):
            return self.model_executor.execute_model(None)
        self.state.wait_while("warmup", timeout=0.005)


class EngineCoreProc(EngineCore):
    def __init__(self, state):
        super().__init__(state)
        self.input_queue = queue.Queue()

    @staticmethod
    def run_engine_core(state):
        engine_core = EngineCoreProc(state)
        engine_core.run_busy_loop()

    def run_busy_loop(self):
        while True:
            self._process_input_queue()
            if self.state.in_phase("warmup", "decode-hang"):
                self.step()

    def _process_input_queue(self):
        if self.state.in_phase("warmup", "decode-hang"):
            return
        try:
            self.input_queue.get(timeout=1.0)  # the API server's requests: blocks while there are none
        except queue.Empty:
            pass


def run_engine_core(state):
    EngineCoreProc.run_engine_core(state)
