"""The registry of attacks: every module in this package that defines `ATTACK`.

An attack module defines

    ATTACK = Attack(name="...", target="what must hold", run=async_fn, upstream="nginx")

(or `ATTACKS`, a list, for one attack at several strengths) where `run(env) -> lib.Outcome`
gets a fresh world (nginx, stall servers and the release proxy with default settings, see
lib.make_env) and must finish within `timeout` seconds (60 at most). `netns=True` builds that
world in a network namespace of its own, for attacks that flood loopback at rates other
tests on the machine should not meet. One file per attack; a new file is picked up by its
name, nothing else to register.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Awaitable, Callable


@dataclass
class Attack:
    name: str
    target: str
    run: Callable[..., Awaitable]
    upstream: str = "nginx"
    timeout: float = 60.0
    netns: bool = False


def all_attacks() -> list[Attack]:
    found = []
    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{__name__}.{m.name}")
        attack = getattr(mod, "ATTACK", None)
        if attack is not None:
            found.append(attack)
        found.extend(getattr(mod, "ATTACKS", []))
    return found
