"""Stand-in (see vllm/__init__.py): vLLM 0.33's vllm/model_executor/model_loader/__init__.py."""


def get_model(*, vllm_config=None, model_config=None, state=None):
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    return DefaultModelLoader().load_model(vllm_config=vllm_config, model_config=model_config, state=state)
