"""Stand-in (see torch/__init__.py) for torch.distributed's collectives as a rank blocks in them: a collective
returns once every rank has joined, which here is when the leader's timeline moves past the phase it was called
in; a rank whose peers never join (the deadlock-at-init and hang-in-decode variants) stays inside it for ever."""

_state = None  # the process's StartupState, set by init_process_group


def init_process_group(backend=None, init_method=None, world_size=-1, rank=-1, store=None):
    global _state
    _state = store


def _join(phase_done):
    if _state is not None:
        _state.wait_while(*phase_done)


def barrier(group=None):
    _join(("init",))


def all_reduce(tensor, op=None, group=None):
    if _state is not None and _state.peers_never_join():
        _state.hang()  # the ranks it waits for are in another collective


def broadcast(tensor, src=0, group=None):
    if _state is not None and _state.peers_never_join():
        _state.hang()
