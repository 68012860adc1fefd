"""One process whose main thread waits while its other threads move, or do not, for the stacks' motion tests.

    python tests/stack_programs/motion.py --mode lines|reads|come-and-go [--fd N]

The main thread always waits on its workers' futures (as a loader's does), at the same line for ever. Modes:
lines (4 workers go round one function, waiting at one line then another: the same function at another line);
reads (a worker reads the pipe --fd, which the test feeds, into a 1 GiB buffer in
one call: BufferedReader.readinto loops on read() in C, so its stack stays at one line while it reads megabytes:
only its reads move); come-and-go (every tenth of a second a new thread starts, sleeps
and ends: threads come and go, nothing that stays moves). Prints "ready" once its threads run.
"""

from __future__ import annotations

import _thread
import argparse
import concurrent.futures
import threading
import time

STOP = threading.Event()


def go_round_one_function() -> None:
    # waits like the main thread's (not sleeps, which read as idle), so the main thread stays the telling one
    while not STOP.is_set():
        STOP.wait(0.03)  # one line
        STOP.wait(0.03)  # and the next


def read_the_pipe(fd: int) -> None:
    with open(fd, "rb", buffering=64 << 10, closefd=False) as pipe:
        pipe.readinto(bytearray(1 << 30))  # one call, many read()s: returns when full or at the end of the pipe


def start_short_lived_threads() -> None:
    # _thread's start does not wait for the thread to run (threading's does): this thread is all but always
    # caught in its sleep, and only the threads it starts come and go
    while not STOP.is_set():
        _thread.start_new_thread(time.sleep, (0.15,))
        time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", required=True, choices=("lines", "reads", "come-and-go"))
    parser.add_argument("--fd", type=int)
    args = parser.parse_args()
    work = {"lines": (go_round_one_function, ()), "reads": (read_the_pipe, (args.fd,)),
            "come-and-go": (start_short_lived_threads, ())}[args.mode]
    workers = 4 if args.mode == "lines" else 1
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(work[0], *work[1]) for _ in range(workers)]
        time.sleep(0.2)
        print("ready", flush=True)
        concurrent.futures.wait(futures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
