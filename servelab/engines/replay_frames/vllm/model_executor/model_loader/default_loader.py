"""Stand-in (see vllm/__init__.py): vLLM 0.33's vllm/model_executor/model_loader/default_loader.py."""

from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator


class DefaultModelLoader(BaseModelLoader):
    def _get_weights_iterator(self, state):
        files = [f"model-{i:05d}-of-00031.safetensors" for i in range(1, 32)]
        return safetensors_weights_iterator(files, True, state=state)

    def get_all_weights(self, model_config, model, state):
        yield from self._get_weights_iterator(state)

    def load_weights(self, model, model_config, state):
        model.load_weights(self.get_all_weights(model_config, model, state))
