"""Stand-in (see sglang/__init__.py): SGLang 0.5.10's srt/model_loader/weight_utils.py: the multithread safetensors loader (8 threads, DEFAULT_NUM_THREADS)."""

import concurrent.futures
import itertools
import os
import time


def multi_thread_safetensors_weights_iterator(hf_weights_files, max_workers=8, state=None):
    """Shards read in a thread pool, their tensors yielded as each completes. The replay reads one real file for
    every shard, and reads the list again while the timeline is still loading (its load is compressed)."""

    def _load_file(st_file):
        fd = state.open_model()
        result = {}
        try:
            offset = 0
            for n in range(16):
                if fd is None or not state.in_phase("load"):
                    break
                state.hold()  # a hang stops the read here, in this frame
                data = os.pread(fd, state.READ_CHUNK, offset)
                offset = offset + len(data) if data else 0
                result[f"{st_file}.part{n}"] = len(data)
                time.sleep(state.READ_PAUSE_S)
        finally:
            if fd is not None:
                os.close(fd)
        return result

    with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers) as executor:
        shards = itertools.takewhile(lambda _: state.in_phase("load"), itertools.cycle(hf_weights_files))
        # two shards queued per thread, so a thread that finishes one starts the next at once
        futures = [executor.submit(_load_file, st_file) for st_file in itertools.islice(shards, 2 * max_workers)]
        while futures:
            done, pending = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_COMPLETED)
            futures = list(pending) + [executor.submit(_load_file, st) for st in itertools.islice(shards, len(done))]
            for future in done:
                yield from future.result().items()


def default_weight_loader(param, loaded_weight):
    param.append(loaded_weight)
