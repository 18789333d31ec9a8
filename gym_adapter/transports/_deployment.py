"""What every deployment does the same way with its arguments: instance names, and one
environment per instance.
"""

from __future__ import annotations

from typing import Any

__all__ = ["instance_names", "per_instance"]


def instance_names(instances: int) -> tuple[str, ...]:
    """``gym-0`` … ``gym-{instances-1}``; ``ValueError`` unless ``instances >= 1``."""
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise ValueError(f"instances must be >= 1, got {instances!r}")
    return tuple(f"gym-{i}" for i in range(instances))


def per_instance(environment: Any, instances: int) -> tuple[Any, ...]:
    """One environment per instance: ``environment`` for all of them, or a list or tuple of
    exactly ``instances`` environments (``ValueError`` naming the counts otherwise)."""
    if isinstance(environment, (list, tuple)):
        if len(environment) != instances:
            raise ValueError(f"got {len(environment)} environments for {instances} instances")
        return tuple(environment)
    return (environment,) * instances
