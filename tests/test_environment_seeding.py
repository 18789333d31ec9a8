"""The environments' one seeding helper (``environments/_seeding.derive_seed``): its values are
part of what a run does (an episode's reset seed, its policy's draws), so they are pinned here,
and every environment derives its seeds with it (no copy of its own)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gymckpt.gym_adapter.environments._seeding import derive_seed

ENVIRONMENTS = Path(__file__).resolve().parent.parent / "gym_adapter" / "environments"


def test_derive_seed_keeps_its_values() -> None:
    """The values the three copies it replaced gave (computed with them)."""
    assert derive_seed("gymckpt-gymnasium", 7, 3, 1) == 6612610778774891345
    assert derive_seed("gymckpt-policy", 0, "1-0:t2") == 5486473422243165108
    assert derive_seed() == 724655455495936113
    assert all(0 <= derive_seed("x", i) < 2**63 for i in range(100))


def test_episode_seeds_keep_their_values() -> None:
    gymnasium_env = pytest.importorskip("gymckpt.gym_adapter.environments.gymnasium")
    textarena_env = pytest.importorskip("gymckpt.gym_adapter.environments.textarena")
    assert gymnasium_env.episode_seed(7, 3, 1) == 1523313489
    assert textarena_env.episode_seed(7, 3, 1) == 431947271


def test_no_environment_keeps_a_seeding_helper_of_its_own() -> None:
    """A function that hashes to a seed is ``_seeding``'s alone: an environment module that
    imports ``hashlib`` uses it for something else (a digest), never in a ``def`` returning
    ``int.from_bytes`` of one."""
    for path in sorted(ENVIRONMENTS.glob("*.py")):
        if path.name == "_seeding.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                calls = {
                    ast.unparse(n.func)
                    for n in ast.walk(node)
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                }
                assert "int.from_bytes" not in calls, f"{path.name}: {node.name}"
