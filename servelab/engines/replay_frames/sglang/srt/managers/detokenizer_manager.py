"""Stand-in (see sglang/__init__.py): SGLang 0.5.10's srt/managers/detokenizer_manager.py: the detokenizer process, waiting for token ids."""


class DetokenizerManager:
    def __init__(self, state):
        self.state = state

    def event_loop(self):
        while True:
            self.recv_from_scheduler()

    def recv_from_scheduler(self):
        self.state.hang()  # recv_pyobj() on the scheduler's socket: the replay never sends a token


def run_detokenizer_process(state):
    DetokenizerManager(state).event_loop()
