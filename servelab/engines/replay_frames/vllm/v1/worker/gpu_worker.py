"""Stand-in (see vllm/__init__.py): vLLM 0.33's vllm/v1/worker/gpu_worker.py: Worker, one per GPU."""

from vllm.distributed.parallel_state import ensure_model_parallel_initialized, init_distributed_environment
from vllm.v1.worker.gpu_model_runner import GPUModelRunner


def init_worker_distributed_environment(rank, world_size, state):
    init_distributed_environment(world_size, rank, "tcp://127.0.0.1:5000", rank, "nccl", state)
    ensure_model_parallel_initialized(world_size, state)


class Worker:
    def __init__(self, rank, world_size, state):
        self.rank, self.world_size, self.state = rank, world_size, state

    def init_device(self):
        init_worker_distributed_environment(self.rank, self.world_size, self.state)
        self.model_runner = GPUModelRunner(self.state)

    def load_model(self):
        self.state.wait_while("init")
        self.model_runner.load_model()

    def determine_available_memory(self):
        self.model_runner.profile_run()

    def compile_or_warm_up_model(self):
        self.model_runner.capture_model()

    def execute_model(self, scheduler_output):
        return self.model_runner.execute_model(scheduler_output)
