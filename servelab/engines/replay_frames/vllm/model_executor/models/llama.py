"""Stand-in (see vllm/__init__.py): vLLM 0.33's vllm/model_executor/models/llama.py."""

from vllm.model_executor.model_loader.weight_utils import default_weight_loader


class LlamaForCausalLM:
    def __init__(self):
        self.params = []

    def load_weights(self, weights):
        for name, loaded_weight in weights:
            default_weight_loader(self.params, (name, loaded_weight))
        self.params.clear()
