"""What a scenario left (``reports``): the JSON form of a seed's report."""

from __future__ import annotations

from gymckpt.app.simulation.reports import LifeReport, ScenarioReport
from gymckpt.app.simulation.scenario import Scenario
from gymckpt.testing.hostile import HostileAct


def report(hostile: bool = False) -> ScenarioReport:
    inc = LifeReport(
        0,
        ("run:drop@2",),
        "crashed",
        None,
        "i0-0001",
        (("i0-0002", False, "gym_unavailable"),),
        (("run:drop@2", 1),),
        3,
        1,
        0,
        {"m": 1.0},
        1,
        (("nan_reward", 1),),
        "unaligned",
        4,
        6,
    )
    acts = (HostileAct(kind="nan_reward", row=0, slot=0, turn=1),) if hostile else ()
    return ScenarioReport(
        seed=5,
        scenario=Scenario(seed=5, hostile=acts),
        ok=False,
        violations=("v",),
        lives=(inc,),
        rows_trained=10,
        rows_failed=2,
        steps=4,
        sentinels=7,
        virtual_s=1.5,
        task_steps=99,
        fingerprint="abc",
    )


def test_the_json_form_names_the_replay_and_each_incarnation() -> None:
    out = report().to_json()
    # drawn without the real-usage dimension, which the command runs by default
    assert out["replay"] == "gymckpt simulate --seeds 1 --start 5 --real-usage none"
    assert " --hostile" in report(hostile=True).to_json()["replay"]
    assert out["scenario"] == Scenario(seed=5).describe()
    (inc,) = out["incarnations"]
    assert inc == {
        "end": "crashed",
        "error": None,
        "restored_from": "i0-0001",
        "faults": ["run:drop@2"],
        "faults_fired": [["run:drop@2", 1]],
        "checkpoints": [["i0-0002", False, "gym_unavailable"]],
        "steps": 3,
        "claims": 1,
        "lease_reopened": 0,
        "hostile_fired": [["nan_reward", 1]],
        "checkpoint_mode": "unaligned",
        "episodes_mid_turn": 4,
        "episodes_taken": 6,
    }
    assert (out["checkpoint_mode"], out["episodes_mid_turn"]) == ("aligned", 4)
    assert (out["seed"], out["ok"], out["violations"], out["fingerprint"]) == (
        5,
        False,
        ["v"],
        "abc",
    )
    assert (out["rows_trained"], out["rows_failed"], out["steps"], out["sentinels"]) == (
        10,
        2,
        4,
        7,
    )
