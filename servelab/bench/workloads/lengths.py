"""Input-length distributions for synthetic prompts, drawn per request from a seeded RNG.

Spec strings (the CLI's `--input-tokens`):
    512                          every prompt exactly 512 tokens
    uniform:256..1024            integers uniform in [256, 1024]
    normal:512,128[,64..2048]    mean 512, standard deviation 128, clipped to [64, 2048] (default [1, inf))
    lognormal:512,256[,64..4096] mean 512 and standard deviation 256 *of the lengths* (not of their logarithm),
                                 clipped likewise: long-tailed, like real chat prompts

Length i depends only on (seed, i), so a request's length does not change when another mode or bound is used.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Literal

from servelab.errors import UserError

Kind = Literal["fixed", "uniform", "normal", "lognormal"]
_HINT = "use N, uniform:MIN..MAX, normal:MEAN,STD[,MIN..MAX] or lognormal:MEAN,STD[,MIN..MAX]"


@dataclass(frozen=True)
class LengthSpec:
    kind: Kind
    mean: float = 0.0  # fixed: the length; normal/lognormal: mean of the lengths
    std: float = 0.0
    min: int = 1
    max: int | None = None

    def draw(self, seed: int, index: int) -> int:
        if self.kind == "fixed":
            return int(self.mean)
        rng = random.Random(f"{seed}:length:{index}")
        if self.kind == "uniform":
            return rng.randint(self.min, self.max or self.min)
        if self.kind == "normal":
            value = rng.gauss(self.mean, self.std)
        else:  # lognormal with the given mean and std of the lengths themselves
            sigma2 = math.log(1.0 + (self.std / self.mean) ** 2)
            value = rng.lognormvariate(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2))
        return self.clip(round(value))

    def clip(self, n: int) -> int:
        return max(self.min, n if self.max is None else min(n, self.max))

    @property
    def bounds(self) -> tuple[int, int | None]:
        """The smallest and largest length this spec can produce (None: unbounded)."""
        if self.kind == "fixed":
            return int(self.mean), int(self.mean)
        return self.min, self.max

    def describe(self) -> str:
        if self.kind == "fixed":
            return str(int(self.mean))
        if self.kind == "uniform":
            return f"uniform:{self.min}..{self.max}"
        rng = f",{self.min}..{self.max if self.max is not None else ''}"
        return f"{self.kind}:{self.mean:g},{self.std:g}{rng}"


def parse_length(spec: str | int) -> LengthSpec:
    if isinstance(spec, int) or str(spec).strip().isdigit():
        n = int(spec)
        if n < 1:
            raise UserError(f"input length must be positive (got {n})")
        return LengthSpec("fixed", mean=n, min=n, max=n)
    text = str(spec).strip()
    kind, _, args = text.partition(":")
    if kind == "uniform":
        lo, hi = _range(args, text)
        return LengthSpec("uniform", min=lo, max=hi)
    if kind in ("normal", "lognormal"):
        parts = args.split(",")
        if len(parts) not in (2, 3):
            raise UserError(f"bad length distribution '{text}'", hint=_HINT)
        try:
            mean, std = float(parts[0]), float(parts[1])
        except ValueError:
            raise UserError(f"bad length distribution '{text}'", hint=_HINT) from None
        if mean < 1 or std < 0:
            raise UserError(f"bad length distribution '{text}': the mean must be >= 1 and the deviation >= 0")
        lo, hi = _range(parts[2], text) if len(parts) == 3 else (1, None)
        return LengthSpec(kind, mean=mean, std=std, min=lo, max=hi)  # type: ignore[arg-type]
    raise UserError(f"bad length distribution '{text}'", hint=_HINT)


def _range(text: str, whole: str) -> tuple[int, int | None]:
    m = re.fullmatch(r"\s*(\d+)\s*\.\.\s*(\d*)\s*", text)
    if not m:
        raise UserError(f"bad length range in '{whole}'", hint=_HINT)
    lo, hi = int(m.group(1)), int(m.group(2)) if m.group(2) else None
    if lo < 1 or (hi is not None and hi < lo):
        raise UserError(f"bad length range in '{whole}': need 1 <= MIN <= MAX")
    if hi is None and whole.startswith("uniform"):
        raise UserError(f"a uniform range needs a maximum: '{whole}'", hint=_HINT)
    return lo, hi
