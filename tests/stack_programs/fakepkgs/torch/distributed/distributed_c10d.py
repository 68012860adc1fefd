"""all_reduce and broadcast as torch names them, each waiting for a peer that never arrives: a threading barrier
of two parties that only this rank reaches, as a Gloo collective waits for the ranks that never join."""

import threading

_NEVER_JOINED = threading.Barrier(2)


def _wait_for_peers():
    _NEVER_JOINED.wait()


def all_reduce(tensor, op=None, group=None, async_op=False):
    _wait_for_peers()
    return tensor


def broadcast(tensor, src=0, group=None, async_op=False):
    _wait_for_peers()
    return tensor
