"""Where `--on` (and an experiment's `on:`) points: a host over SSH, or a node of a Ray cluster chosen by the
resources it has.

    ssh://[user@]host[:port]            that host (target.py)
    ray:GPU=8                           a node with 8 GPUs free, held for the whole command
    ray:GPU=8,CPU=4                     and 4 CPUs
    ray:accelerator_type:H100=1         a custom resource (Ray names a node's accelerator type this way), or any
    ray:GPU=8,my_rack_a=1               custom resource the cluster's nodes were started with (`ray start
                                        --resources '{"my_rack_a": 1}'`)

Parsing needs no Ray: a file with `on: ray:GPU=8` is checked where Ray is not installed, and servelab imports
without it. What the placement becomes once a cluster is there (an actor holding those resources) is
ray_link.py's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from servelab.errors import UserError
from servelab.remote.target import SshTarget

RAY_PREFIX = "ray:"
RAY_SYNTAX = "ray:RESOURCE=N[,RESOURCE=N…], e.g. ray:GPU=8 or ray:GPU=8,CPU=4"
ON_SYNTAX = "ssh://[user@]host[:port] or ray:RESOURCE=N[,…] (e.g. ray:GPU=8)"

# Ray's own resource names: GPU and CPU are counts, memory bytes; every other name is a custom resource. Names
# as Ray allows them, a colon included (its accelerator types are `accelerator_type:H100`).
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/\-]*$")
_BUILTIN = {"gpu": "GPU", "cpu": "CPU", "memory": "memory"}


@dataclass(frozen=True)
class RayPlacement:
    """A Ray node chosen by resources: the command's far side runs in an actor that holds them."""

    resources: tuple[tuple[str, float], ...]  # in the order given, each name once

    @classmethod
    def parse(cls, spec: str) -> RayPlacement:
        if spec.startswith("ray://"):
            raise UserError(f"'{spec}' is a Ray client address, not a placement",
                            hint=f"--on takes {RAY_SYNTAX}; the cluster is RAY_ADDRESS's (default: the one "
                                 f"`ray start` made on this host)")
        if not spec.startswith(RAY_PREFIX):
            raise UserError(f"'{spec}' is not a Ray placement", hint=RAY_SYNTAX)
        body = spec[len(RAY_PREFIX):].strip()
        if not body:
            raise UserError(f"'{spec}' names no resources", hint=RAY_SYNTAX)
        seen: dict[str, float] = {}
        for item in body.split(","):
            item = item.strip()
            name, equals, value = item.rpartition("=")
            name = name.strip()
            if not equals or not name:
                raise UserError(f"'{item}' in '{spec}' is not RESOURCE=N", hint=RAY_SYNTAX)
            if not _NAME.match(name):
                raise UserError(f"'{name}' in '{spec}' is not a resource name (letters, digits, _ . : / -)",
                                hint=RAY_SYNTAX)
            name = _BUILTIN.get(name.lower(), name)
            try:
                amount = float(value)
            except ValueError:
                amount = math.nan
            if not math.isfinite(amount) or amount <= 0:
                raise UserError(f"'{item}' in '{spec}': the amount must be a number above 0", hint=RAY_SYNTAX)
            if name == "memory" and amount != int(amount):  # Ray takes fractions of anything but bytes
                raise UserError(f"'{item}' in '{spec}': memory is a whole number of bytes", hint=RAY_SYNTAX)
            if name in seen:
                raise UserError(f"'{spec}' names {name} twice", hint=RAY_SYNTAX)
            seen[name] = amount
        return cls(resources=tuple(seen.items()))

    @property
    def wanted(self) -> dict[str, float]:
        return dict(self.resources)

    def actor_options(self) -> dict:
        """What `ActorClass.options(...)` is given: Ray's own keywords for its own resources, the rest as
        custom ones. An unnamed CPU count is 0, not Ray's default 1: a GPU node whose CPUs are all taken by
        other work can still be placed on (the command's processes are not Ray tasks; they are not counted)."""
        wanted = self.wanted
        options: dict = {"num_cpus": wanted.get("CPU", 0), "num_gpus": wanted.get("GPU", 0)}
        if "memory" in wanted:
            options["memory"] = int(wanted["memory"])
        custom = {k: v for k, v in wanted.items() if k not in ("CPU", "GPU", "memory")}
        if custom:
            options["resources"] = custom
        return options

    @property
    def host(self) -> str:  # what a message names before the node is known
        return str(self)

    def __str__(self) -> str:
        return RAY_PREFIX + ",".join(f"{k}={v:g}" for k, v in self.resources)


def parse_on(on: str) -> SshTarget | RayPlacement:
    """`--on`'s value: an SshTarget or a RayPlacement; UserError in one line for anything else."""
    if on.startswith(RAY_PREFIX):
        return RayPlacement.parse(on)
    if on.startswith("ssh:"):
        return SshTarget.parse(on)
    raise UserError(f"'{on}' is not an ssh:// URL nor a Ray placement", hint=f"--on {ON_SYNTAX}")


def is_ray(on: str | None) -> bool:
    return bool(on) and on.startswith(RAY_PREFIX)
