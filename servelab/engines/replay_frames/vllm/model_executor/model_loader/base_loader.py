"""Stand-in (see vllm/__init__.py): vLLM 0.33's vllm/model_executor/model_loader/base_loader.py."""

from vllm.model_executor.models.llama import LlamaForCausalLM


class BaseModelLoader:
    def __init__(self, load_config=None):
        self.load_config = load_config

    def load_model(self, vllm_config=None, model_config=None, state=None):
        model = LlamaForCausalLM()
        self.load_weights(model, model_config, state)
        return model
