"""Stand-in (see sglang/__init__.py): SGLang 0.5.10's srt/model_loader/__init__.py."""


def get_model(*, model_config=None, load_config=None, device_config=None, state=None):
    from sglang.srt.model_loader.loader import DefaultModelLoader

    return DefaultModelLoader(load_config).load_model(model_config=model_config, device_config=device_config,
                                                      state=state)
