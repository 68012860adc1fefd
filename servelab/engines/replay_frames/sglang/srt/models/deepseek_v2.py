"""Stand-in (see sglang/__init__.py): SGLang 0.5.10's srt/models/deepseek_v2.py: the model class whose load_weights takes the loader's tensors."""

from sglang.srt.model_loader.weight_utils import default_weight_loader


class DeepseekV2ForCausalLM:
    def __init__(self):
        self.params = []

    def load_weights(self, weights):
        for name, loaded_weight in weights:
            default_weight_loader(self.params, (name, loaded_weight))
        self.params.clear()
