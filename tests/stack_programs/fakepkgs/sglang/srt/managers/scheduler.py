"""A scheduler loop with SGLang's names (sglang/srt/managers/scheduler.py): event_loop_overlap calls recv_requests,
then run_batch when there is work. recv_requests reads the tokenizer's socket; with no client it blocks."""


class Scheduler:
    def __init__(self, requests_socket, model, has_work):
        self.requests_socket = requests_socket
        self.model = model
        self.has_work = has_work

    def event_loop_overlap(self):
        step = 0
        while True:
            if not self.has_work:
                self.recv_requests()
            self.run_batch(step)
            step += 1

    def recv_requests(self):
        return self.requests_socket.recv(4096)  # nobody sends: an idle server waiting for requests

    def run_batch(self, step):
        return self.model.forward(step)
