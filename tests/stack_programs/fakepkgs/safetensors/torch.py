"""load_file as safetensors names it: reads the file in chunks, at a call depth that changes with the clock so that
two samples a fraction of a second apart see different stacks (a load in progress moves)."""

import time

CHUNK = 1 << 20


def load_file(filename, device="cpu"):
    return _read_tensors(filename, 1 + int(time.monotonic() * 10) % 11)


def _read_tensors(filename, depth):
    if depth > 0:
        return _read_tensors(filename, depth - 1)
    total = 0
    with open(filename, "rb") as fh:
        for _ in range(64):
            chunk = fh.read(CHUNK)
            if not chunk:
                fh.seek(0)
            total += sum(chunk[::4096])
            time.sleep(0.002)  # leave the machine's cores to the rest
    return total
