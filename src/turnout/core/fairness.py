"""Weighted round-robin across tenants: who gets the next free slot when several wait.

Pure: the dispatcher asks ``pick`` with the tenants that have a waiter able to go right now and their
weights; a tenant of weight W gets up to W consecutive turns before the next tenant in line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["WeightedRoundRobin"]


@dataclass(slots=True)
class WeightedRoundRobin:
    order: list[str] = field(default_factory=list)  # tenants in the order they first waited
    current: str | None = None
    used: int = 0

    def pick(self, candidates: Sequence[str], weight: Callable[[str], int]) -> str | None:
        if not candidates:
            return None
        for tenant in candidates:
            if tenant not in self.order:
                self.order.append(tenant)
        if self.current is not None and self.current in candidates and self.used < max(1, weight(self.current)):
            self.used += 1
            return self.current
        start = self.order.index(self.current) + 1 if self.current in self.order else 0
        for step in range(len(self.order)):
            tenant = self.order[(start + step) % len(self.order)]
            if tenant in candidates:
                self.current, self.used = tenant, 1
                return tenant
        return None  # unreachable: every candidate is in order
