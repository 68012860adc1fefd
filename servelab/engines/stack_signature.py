"""What one activity looks like in a stack: the shape engine adapters declare their `stack_signatures` in.

It lives beside the adapters (and needs nothing but the standard library) so that an adapter can declare its
signatures without importing servelab.lifecycle, which imports the adapters. lifecycle/stacks/signatures.py
re-exports it with the generic signatures, and lifecycle/stacks/classify.py applies them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

StackKind = Literal["loading", "idle", "busy", "waiting", "collective", "unknown"]


@dataclass(frozen=True)
class StackSignature:
    """An activity (e.g. "idle in the request loop") recognised by one frame of a thread's stack.

    `functions` are regular expressions matched in full against a frame's function name as py-spy gives it
    (`Scheduler.event_loop_overlap` for a method, `recv` for a native frame) or against its last dotted part
    (so "event_loop_overlap" also matches the method). `modules` are regular expressions searched in the frame's
    file ("sglang/srt/managers/scheduler\\.py$") or native library ("libnccl"). A frame matches when it matches
    one of each (an empty list matches anything); with `within`, another frame of the same thread must also come
    from one of those modules (a select() inside uvicorn is an idle HTTP server). `activity` and `detail` may
    name the matched function with `{function}` (as py-spy names it), e.g. activity "in {function}" for a collective.
    """

    activity: str
    kind: StackKind
    functions: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    detail: str | None = None
    native: bool | None = None  # True: only native frames, False: only Python frames, None: either
    within: tuple[str, ...] = ()  # module regexes one of the thread's other frames must match (e.g. "uvicorn/")
    # The Python thread only parks while native threads py-spy does not list do the work (llama.cpp's server):
    # the process's CPU time during the capture then tells idle from busy.
    native_work: bool = False
    _function_res: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    _module_res: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    _within_res: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_function_res", tuple(re.compile(p) for p in self.functions))
        object.__setattr__(self, "_module_res", tuple(re.compile(p) for p in self.modules))
        object.__setattr__(self, "_within_res", tuple(re.compile(p) for p in self.within))

    def matches(self, function: str, module: str | None, native: bool) -> bool:
        if self.native is not None and self.native != native:
            return False
        if self._function_res:
            last = function.rsplit(".", 1)[-1]
            if not any(r.fullmatch(function) or r.fullmatch(last) for r in self._function_res):
                return False
        if self._module_res:
            path = (module or "").replace("\\", "/")
            if not any(r.search(path) for r in self._module_res):
                return False
        return True

    def within_matches(self, modules: list[str | None]) -> bool:
        """Whether one of the thread's frames (their modules) satisfies `within` (always, without one)."""
        if not self._within_res:
            return True
        return any(r.search((m or "").replace("\\", "/")) for m in modules for r in self._within_res)

    def named(self, function: str) -> tuple[str, str | None]:
        """The activity and detail with `{function}` filled in (as py-spy names it: `Queue.get`)."""
        return (self.activity.replace("{function}", function),
                self.detail.replace("{function}", function) if self.detail else None)
