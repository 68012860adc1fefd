"""Stand-in (see sglang/__init__.py): SGLang 0.5.10's srt/model_loader/loader.py: DefaultModelLoader."""

from sglang.srt.model_loader.weight_utils import multi_thread_safetensors_weights_iterator
from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM


class DefaultModelLoader:
    def __init__(self, load_config=None):
        self.load_config = load_config

    def _get_weights_iterator(self, state):
        files = [f"model-{i:05d}-of-00064.safetensors" for i in range(1, 65)]
        return multi_thread_safetensors_weights_iterator(files, max_workers=8, state=state)

    def _get_all_weights(self, model_config, model, state):
        yield from self._get_weights_iterator(state)

    def load_model(self, *, model_config=None, device_config=None, state=None):
        model = DeepseekV2ForCausalLM()
        self.load_weights_and_postprocess(model, self._get_all_weights(model_config, model, state), None)
        return model

    @staticmethod
    def load_weights_and_postprocess(model, weights, target_device):
        model.load_weights(weights)
