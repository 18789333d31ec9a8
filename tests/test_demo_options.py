"""The demo's options (``demo_options``): flags checked on construction, a JSON round trip for
the phase processes, runtime settings layered strictly."""

from __future__ import annotations

import pytest

from gymckpt.app.demo.envs import FAMILIES
from gymckpt.app.demo.options import CRASH_STAGES, MID_PUBLISH, TURN_S, DemoOptions
from gymckpt.runtime import CheckpointMode, ManifestError


def test_options_round_trip_through_json() -> None:
    opts = DemoOptions(rows=8, faults=("prepare:hang@1",), runtime=(("lease_s", 60.0),))
    assert DemoOptions.from_json(opts.to_json()) == opts


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"rows": 0}, "--rows must be >= 1"),
        ({"crash_after_checkpoint": -1}, "--crash-after-checkpoint must be >= 0"),
        ({"crash_stage": "nowhere"}, "--crash-at-stage must be one of"),
        ({"crash_stage": MID_PUBLISH, "crash_after_checkpoint": 0}, "needs --crash-after"),
        ({"backend": "grpc"}, "--backend must be one of embedded, ray, http"),
        ({"checkpoint_mode": "sideways"}, "--checkpoint-mode must be aligned or unaligned"),
        ({"env": "gymnasium:CartPole-v1", "backend": "ray"}, "runs on --backend embedded"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DemoOptions(**kw)  # type: ignore[arg-type]


def test_crash_stages_are_the_hook_points_and_mid_publish() -> None:
    assert CRASH_STAGES[-1] == MID_PUBLISH and "after_publish" in CRASH_STAGES


def test_runtime_settings_override_the_demos_strictly() -> None:
    assert DemoOptions().runtime_config().lease_s == 30.0
    assert DemoOptions(runtime=(("lease_s", 60.0),)).runtime_config().lease_s == 60.0
    with pytest.raises(ManifestError, match=r"cfg\.toml"):
        DemoOptions(runtime=(("no_such_field", 1),)).runtime_config("cfg.toml")
    choice = DemoOptions(env="gymnasium:CartPole-v1").env_choice
    assert choice is not None and choice.env_id == "CartPole-v1"
    assert choice.family is FAMILIES["gymnasium:"] and choice.label == "gymnasium:CartPole-v1"
    assert DemoOptions().env_choice is None
    assert DemoOptions(hold_first_mutation=True).sim_config().hold_after_first_mutation


def test_the_checkpoint_mode_is_the_trainers_and_only_the_demos_option() -> None:
    assert DemoOptions().runtime_config().checkpoint_mode is CheckpointMode.ALIGNED
    unaligned = DemoOptions(checkpoint_mode="unaligned", runtime=(("lease_s", 60.0),))
    again = DemoOptions.from_json(unaligned.to_json())  # what a phase process is handed
    assert again == unaligned
    assert again.runtime_config().checkpoint_mode is CheckpointMode.UNALIGNED
    with pytest.raises(ManifestError, match=r"cfg\.toml: checkpoint_mode is the demo's option"):
        DemoOptions(runtime=(("checkpoint_mode", "unaligned"),)).runtime_config("cfg.toml")


def test_unaligned_calendar_turns_are_long_enough_to_be_cut_and_aligned_ones_short() -> None:
    assert DemoOptions().sim_config().turn_s == TURN_S["aligned"] == (0.005, 0.02)
    unaligned = DemoOptions(checkpoint_mode="unaligned").sim_config().turn_s
    assert unaligned == TURN_S["unaligned"] and unaligned[0] > TURN_S["aligned"][1]
