"""Tests for ``gymckpt.runtime._topology``: how a live deployment differs from a manifest (S8).

Same participants by name, of the same kinds, in the same order, for the same instances; each
difference is one line, in a stable order: per committed instance (missing; then listed twice,
missing participant, another kind, extra participant, another order), then live instances the
manifest does not have, sorted.
"""

from __future__ import annotations

from gymckpt.runtime._snapshot_format import (
    MANIFEST_VERSION,
    GymManifest,
    InstanceRecord,
    ParticipantRecord,
)
from gymckpt.runtime._topology import participant_differences, topology_differences


def p(name: str, kind: str) -> ParticipantRecord:
    return ParticipantRecord(name, kind, f"gym/{name}", "sha256:0")


COMMITTED = (p("agent", "simple_agent"), p("env", "environment"), p("proxy", "model_proxy"))
LIVE = [("agent", "simple_agent"), ("env", "environment"), ("proxy", "model_proxy")]


def manifest(*names: str) -> GymManifest:
    return GymManifest(
        MANIFEST_VERSION, "c1", tuple(InstanceRecord(n, COMMITTED) for n in names), ()
    )


def test_the_same_topology_has_no_difference() -> None:
    assert participant_differences("i", COMMITTED, LIVE) == []
    assert participant_differences("i", COMMITTED, tuple(LIVE)) == []
    assert participant_differences("i", (), []) == []
    assert topology_differences(manifest("g0", "g1"), {"g1": LIVE, "g0": LIVE}) == []
    assert topology_differences(manifest(), {}) == []


def test_a_missing_participant() -> None:
    assert participant_differences("i", COMMITTED, LIVE[:2]) == [
        "i: participant proxy missing from the live deployment"
    ]


def test_an_extra_participant() -> None:
    assert participant_differences("i", COMMITTED, [*LIVE, ("more", "environment")]) == [
        "i: extra live participant more"
    ]


def test_another_kind() -> None:
    live = [LIVE[0], ("env", "legacy_agent"), LIVE[2]]
    assert participant_differences("i", COMMITTED, live) == [
        "i: participant env kind environment committed, legacy_agent live"
    ]


def test_another_order_names_both_orders_of_the_common_participants() -> None:
    live = [LIVE[2], LIVE[0], LIVE[1]]
    assert participant_differences("i", COMMITTED, live) == [
        "i: participant order agent, env, proxy committed, proxy, agent, env live"
    ]


def test_order_is_compared_over_common_participants_only() -> None:
    # a missing and an extra participant do not make an order difference by themselves
    live = [("new", "environment"), LIVE[0], LIVE[2]]
    assert participant_differences("i", COMMITTED, live) == [
        "i: participant env missing from the live deployment",
        "i: extra live participant new",
    ]


def test_a_participant_listed_twice_live_is_one_line_and_its_first_listing_counts() -> None:
    live = [LIVE[0], LIVE[1], ("env", "model_proxy"), LIVE[2]]
    assert participant_differences("i", COMMITTED, live) == ["i: live participant env listed twice"]


def test_every_difference_is_listed_in_order() -> None:
    live = [
        ("proxy", "legacy_agent"),
        ("agent", "simple_agent"),
        ("agent", "simple_agent"),
        ("x", "environment"),
    ]
    assert participant_differences("w", COMMITTED, live) == [
        "w: live participant agent listed twice",
        "w: participant env missing from the live deployment",
        "w: participant proxy kind model_proxy committed, legacy_agent live",
        "w: extra live participant x",
        "w: participant order agent, proxy committed, proxy, agent live",
    ]


def test_instances_missing_and_not_in_the_manifest() -> None:
    unknown = ["zz", "yy", "m", "b2", "b10", "aa"]
    live = {name: LIVE for name in unknown} | {"g2": LIVE[:1], "g0": LIVE}
    diffs = topology_differences(manifest("g0", "g1", "g2"), live)
    assert diffs == [
        "instance g1: missing from the live deployment",
        "instance g2: participant env missing from the live deployment",
        "instance g2: participant proxy missing from the live deployment",
        *(f"instance {name}: live but not in the manifest" for name in sorted(unknown)),
    ]


def test_an_instance_with_no_live_participants_lists_each_committed_one() -> None:
    assert topology_differences(manifest("g0"), {"g0": []}) == [
        f"instance g0: participant {n} missing from the live deployment"
        for n in ("agent", "env", "proxy")
    ]
