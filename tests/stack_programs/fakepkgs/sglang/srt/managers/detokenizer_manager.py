"""SGLang's detokenizer loop (sglang/srt/managers/detokenizer_manager.py): waits for the schedulers' outputs."""


class DetokenizerManager:
    def __init__(self, outputs_socket):
        self.outputs_socket = outputs_socket

    def event_loop(self):
        while True:
            self.outputs_socket.recv(4096)
