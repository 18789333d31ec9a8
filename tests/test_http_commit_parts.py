"""A commit answered in parts (``http/_parts``, ``PARTS_FEATURE``) against real ``gymckpt
serve`` processes on loopback: the server sends an NDJSON body of parts of at most
``PART_RECORDS`` records when asked, the client decodes one part per step of its loop and gets
the reply the one-piece answer carries, a server that does not advertise the feature is asked
as before, and a body that is not the wire form fails the commit retryably.

Real time for the servers; every wait is bounded by the call's deadline or ``trio.fail_after``.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import orjson
import pytest
import trio
from collections_seen import collections_seen
from test_http_backend import deadline, http_gym, rows

from gymckpt.gym_adapter import HttpGym
from gymckpt.gym_adapter._contract import AgentSession, CommitReply, ExportedEpisode
from gymckpt.gym_adapter.environments.calendar import CalendarConfig
from gymckpt.gym_adapter.transports._deadlines import WireDeadline
from gymckpt.gym_adapter.transports._wire import WireFormatError
from gymckpt.gym_adapter.transports.http import _gym as http_gym_module
from gymckpt.gym_adapter.transports.http._calls import post_request
from gymckpt.gym_adapter.transports.http._parts import (
    NDJSON,
    PART_RECORDS,
    PARTS_FEATURE,
    CommitParts,
    decode_in_steps,
    encode_commit_parts,
)
from gymckpt.gym_adapter.transports.http._wire import FEATURES_HEADER, encode_control_request
from gymckpt.runtime import CheckpointMode, GymCallTimeout

pytestmark = [pytest.mark.http, pytest.mark.timeout(240)]

STILL = CalendarConfig(turns=(2, 2), turn_s=(120.0, 120.0), mutation_p=1.0)
"""Episodes whose turns outlast the test: two commits of one checkpoint find the same cut."""
IN_FLIGHT = PART_RECORDS + PART_RECORDS // 2
"""More episodes than one part holds."""


async def _prepared(gym: HttpGym) -> None:
    """``IN_FLIGHT`` episodes admitted on gym-0 and an unaligned checkpoint ``c1`` prepared."""
    stream = await gym.run("gym-0", rows(IN_FLIGHT))  # every row admitted once it returns
    assert len((await gym.inventory("gym-0")).running) == IN_FLIGHT
    await gym.prepare("gym-0", "c1", deadline(30), CheckpointMode.UNALIGNED)
    del stream


async def test_the_server_answers_a_commit_in_parts_when_asked(tmp_path: Path) -> None:
    """``Accept: application/x-ndjson`` on a commit: an NDJSON body, its head first, then parts
    of at most ``PART_RECORDS`` records, which decode to the reply's records."""
    async with http_gym(tmp_path, config=STILL) as gym:
        await _prepared(gym)
        endpoint = gym._endpoints["gym-0"]
        client = gym._control_client
        assert client is not None
        health = await client.get(endpoint.url + "/health")
        assert PARTS_FEATURE in health.headers[FEATURES_HEADER].split(",")
        now = trio.current_time()
        body = encode_control_request(
            "commit",
            deadline=WireDeadline.send(now + 30, now, time.time()),
            acks={},
            fault=None,
            args={"checkpoint_id": "c1", "state_root": str(tmp_path / "s1")},
        )
        request = post_request(
            client, f"{endpoint.url}/control/v1/commit", body, endpoint.incarnation_id
        )
        request.headers["Accept"] = NDJSON
        response = await client.send(request)
        assert response.status_code == 200
        assert response.headers["content-type"] == NDJSON
        lines = response.content.splitlines()
        head = orjson.loads(lines[0])["head"]
        assert head["exported"] == IN_FLIGHT
        sizes = [len(next(iter(orjson.loads(line).values()))) for line in lines[1:]]
        assert max(sizes) <= PART_RECORDS
        assert len(sizes) >= 2
        parts = CommitParts()
        for line in lines:
            parts.feed(line)
        reply = parts.reply()
        assert len(reply.exported) == IN_FLIGHT
        assert len({e.rollout_id for e in reply.exported}) == IN_FLIGHT


async def test_the_client_decodes_a_commit_part_per_step_and_gets_the_one_piece_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HttpGym.commit`` of a server that advertises ``PARTS_FEATURE``: no step of the
    trainer's loop decodes more than ``PART_RECORDS`` records, and the reply equals the one a
    server answering in one piece gives for the same cut."""
    async with http_gym(tmp_path, config=STILL) as gym:
        await _prepared(gym)
        assert gym._endpoints["gym-0"].parts
        in_parts = await gym.commit("gym-0", "c1", str(tmp_path / "s1"), deadline(30))
        assert 0 < gym.largest_commit_step <= PART_RECORDS
        assert len(in_parts.exported) == IN_FLIGHT
        monkeypatch.setattr(gym._endpoints["gym-0"], "parts", False)
        whole = await gym.commit("gym-0", "c1", str(tmp_path / "s2"), deadline(30))
        assert gym.largest_commit_step == len(whole.exported) + len(whole.sessions)
        assert in_parts == whole


async def test_a_commit_whose_parts_outlast_its_deadline_times_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parts are read within the call's bound: a body still being decoded past the
    deadline (plus its grace) is ``GymCallTimeout``, as a one-piece answer that never comes."""

    async def never(next_line: object) -> CommitParts:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    monkeypatch.setattr(http_gym_module, "decode_in_steps", never)
    async with http_gym(tmp_path, config=STILL) as gym:
        await _prepared(gym)
        with trio.fail_after(30), pytest.raises(GymCallTimeout):
            await gym.commit("gym-0", "c1", str(tmp_path / "s1"), deadline(0.5))


async def test_a_server_that_does_not_advertise_parts_is_asked_for_one_piece(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that does not find ``PARTS_FEATURE`` in ``Gymckpt-Features`` (an older server)
    asks for the commit as before and decodes it whole."""
    monkeypatch.setattr(http_gym_module, "PARTS_FEATURE", "parts/99")  # not what it says
    async with http_gym(tmp_path, config=STILL) as gym:
        await _prepared(gym)
        assert not gym._endpoints["gym-0"].parts
        reply = await gym.commit("gym-0", "c1", str(tmp_path / "s1"), deadline(30))
        assert len(reply.exported) == IN_FLIGHT
        assert gym.largest_commit_step == IN_FLIGHT + len(reply.sessions)


# -- the wire form, strictly ---------------------------------------------------------------


def _reply(exported: int, sessions: int) -> CommitReply:
    return CommitReply(
        "gym-0",
        "c1",
        (),
        tuple(ExportedEpisode(f"r{i}", "calendar", ("k",)) for i in range(exported)),
        ("r0",),
        tuple(AgentSession(f"r{i}", "calendar", "retained", 2, ()) for i in range(sessions)),
        3,
    )


def test_the_parts_decode_to_the_reply_they_encode() -> None:
    reply = _reply(PART_RECORDS * 2 + 5, PART_RECORDS + 1)
    lines = list(encode_commit_parts(reply))
    assert len(lines) == 1 + 3 + 2
    parts = CommitParts()
    for line in lines:
        parts.feed(line)
    assert parts.reply() == reply
    assert parts.largest_part == PART_RECORDS


@pytest.mark.parametrize(
    ("cut", "match"),
    [
        (lambda ls: ls[:-1], "ended after"),  # the body stops short
        (lambda ls: ls[1:], "before the head"),  # no head first
        (lambda ls: [ls[0], ls[2], ls[1]], "before every one of the exported"),  # out of order
        (lambda ls: [*ls, ls[-1]], "more sessions records"),  # past the head's count
        (lambda ls: [ls[0], b'{"extra":[1]}'], "unknown part"),
        (lambda ls: [b'{"head":{}}'], "exactly the keys"),
    ],
)
def test_a_body_that_is_not_the_wire_form_is_refused(cut: object, match: str) -> None:
    lines = cut(list(encode_commit_parts(_reply(3, 2))))  # type: ignore[operator]
    parts = CommitParts()
    with pytest.raises(WireFormatError, match=match):
        for line in lines:
            parts.feed(line)
        parts.reply()


async def test_the_client_decodes_lines_that_arrived_together_in_steps_of_their_own() -> None:
    """``decode_in_steps`` over lines already read (no wait between them): every line is
    decoded in a task step of its own (the task yields to the loop between two)."""
    me = trio.lowlevel.current_task()
    step = 0
    seen: list[int] = []
    lines = iter(encode_commit_parts(_reply(PART_RECORDS * 2, PART_RECORDS)))

    class Steps(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            nonlocal step
            if task is me:
                step += 1

    async def next_line() -> bytes | None:
        line = next(lines, None)
        if line is not None:
            seen.append(step)
        return line

    instrument = Steps()
    trio.lowlevel.add_instrument(instrument)
    try:
        parts = await decode_in_steps(next_line)
    finally:
        trio.lowlevel.remove_instrument(instrument)
    assert parts.reply() == _reply(PART_RECORDS * 2, PART_RECORDS)
    assert len(seen) == 4
    assert all(a < b for a, b in itertools.pairwise(seen)), seen


async def test_no_collection_runs_while_a_commit_answer_is_decoded() -> None:
    """Each part's records are made with no garbage collection and then promoted
    (``records_promoted``): a young collection in the trainer's loop walks whatever CPython put
    back in the young generations uncounted (tens of ms at 200k in flight), several times per
    part on main. The decoded reply is unchanged."""
    reply = _reply(PART_RECORDS * 8, PART_RECORDS * 8)
    lines = iter(list(encode_commit_parts(reply)))

    async def next_line() -> bytes | None:
        return next(lines, None)

    with collections_seen() as collections:
        parts = await decode_in_steps(next_line)
    assert collections == [], f"{len(collections)} collections while 16k records were decoded"
    assert parts.reply() == reply
