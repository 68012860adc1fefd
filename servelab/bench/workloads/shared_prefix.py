"""Shared-prefix groups: N groups of M consecutive requests, each group's prompts opening with the same P tokens.

This is the prefix-cache workload: within a group, a server that caches prefixes computes the shared part once.
Prompt i belongs to group (i // M) mod N and is OPENER + the group's P filler tokens + its own filler tokens up
to its drawn length; all lengths are exact after the chat template, as for synthetic prompts (synthetic.py).
The part every request of a group shares is therefore the template's head, the opener and the P group tokens.
Requests past N x M start over at group 0 with new suffixes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from servelab.bench.workloads.filler import OPENER, filler
from servelab.bench.workloads.synthetic import SyntheticWorkload
from servelab.errors import UserError


@dataclass
class SharedPrefixWorkload(SyntheticWorkload):
    groups: int = 4
    per_group: int = 8
    prefix_tokens: int = 256

    kind = "shared_prefix"

    def __post_init__(self) -> None:
        if self.groups < 1 or self.per_group < 1 or self.prefix_tokens < 1:
            raise UserError("prefix groups, requests per group and prefix tokens must be positive")

    def group(self, index: int) -> int:
        return (index // self.per_group) % self.groups

    @property
    def minimum(self) -> int:
        return self._need_overhead() + self.prefix_tokens + 1

    @property
    def minimum_why(self) -> str:
        return (f"the chat template and opener take {self.overhead}, the shared prefix {self.prefix_tokens}, "
                f"plus one distinct word")

    def text(self, index: int) -> str:
        prefix = filler(self.words, random.Random(f"{self.seed}:prefix:{self.group(index)}"), self.prefix_tokens)
        own = self.length(index) - self._need_overhead() - self.prefix_tokens
        return OPENER + prefix + filler(self.words, random.Random(f"{self.seed}:words:{index}"), own)

    def describe(self, accepts_ignore_eos: bool, accepts_min_tokens: bool = False) -> dict[str, Any]:
        return super().describe(accepts_ignore_eos, accepts_min_tokens) | {
            "prefix_groups": self.groups, "requests_per_group": self.per_group,
            "prefix_tokens": self.prefix_tokens,
            "grouping": "request i is in group (i // requests_per_group) % prefix_groups"}
