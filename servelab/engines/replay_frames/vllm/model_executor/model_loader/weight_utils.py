"""Stand-in (see vllm/__init__.py): vLLM 0.33's vllm/model_executor/model_loader/weight_utils.py: shards read one after the other in the worker's main
thread."""

import itertools
import os
import time


def safetensors_weights_iterator(hf_weights_files, use_tqdm_on_load=True, state=None):
    """The replay reads one real file for every shard, and the list again while the timeline still loads."""
    for st_file in itertools.cycle(hf_weights_files):
        if not state.in_phase("load"):
            return
        fd = state.open_model()
        if fd is None:
            state.wait_while("load")
            return
        try:
            offset = 0
            for n in range(16):
                if not state.in_phase("load"):
                    break
                state.hold()  # a hang stops the read here, in this frame
                data = os.pread(fd, state.READ_CHUNK, offset)
                offset = offset + len(data) if data else 0
                time.sleep(state.READ_PAUSE_S)
                yield f"{st_file}.part{n}", len(data)
        finally:
            os.close(fd)


def default_weight_loader(param, loaded_weight):
    param.append(loaded_weight)
