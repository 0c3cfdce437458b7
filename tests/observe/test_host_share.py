"""Host sharing: the solo times beneath measurements of agents that crowded one host."""

import pytest

from backend.observe.host_share import host_share
from backend.observe.live_profile import live_profile
from backend.policy.calibration import Calibrator, DecodeStepSample, PrefillSample
from backend.policy.cost_model import CostModel, DecodeFit, LinkModel, PrefillFit
from backend.rpc.reports import Join

COST = CostModel(PrefillFit(0.01, 1e-4), DecodeFit(0.002, 0.001, 0.0), LinkModel(1e9), 2048)


def _solo_s(tokens: int) -> float:
    return COST.prefill_time_s(tokens, 0)


def _crowded_window() -> tuple[list[PrefillSample], list[DecodeStepSample]]:
    """Two prefill agents on a one-core host: each prefill alone for a while, then pairs
    of equal prefills computed together (each took twice its solo time), while a decode
    agent idles; then decode steps beside one prefill (each of them twice as slow)."""
    prefill, decode = [], []
    now_s = 0.0
    for n in range(10):  # alone
        tokens = 100 + 90 * n
        now_s += _solo_s(tokens)
        prefill.append(PrefillSample(now_s, tokens, 0, _solo_s(tokens)))
        now_s += 0.5
    for n in range(10):  # in pairs on one core: each progresses at 1/2
        tokens = 150 + 80 * n
        now_s += 2 * _solo_s(tokens)
        prefill += [PrefillSample(now_s, tokens, 0, 2 * _solo_s(tokens))] * 2
        now_s += 0.5
    start_s = now_s
    for _ in range(40):  # decode steps of 5 ms solo beside a prefill
        now_s += 0.010
        decode.append(DecodeStepSample(now_s, 3, 300, 0.010))
    prefill.append(PrefillSample(now_s, 1900, 0, now_s - start_s))  # 0.2 s solo, at 1/2
    return prefill, decode


def test_the_cores_and_solo_times_of_a_crowded_host_are_recovered() -> None:
    prefill, decode = _crowded_window()
    share = host_share(prefill, decode, num_agents=3, min_prefill_points=20)
    assert share is not None
    assert share.cores == pytest.approx(1.0, abs=0.051)
    for measured, solo in zip(prefill, share.prefill, strict=True):
        assert solo.seconds == pytest.approx(_solo_s(measured.input_tokens), rel=0.06)
    assert [step.seconds for step in share.decode] == pytest.approx([0.005] * 40, rel=0.06)
    assert 1.0 < share.mean_busy_agents < 2.0


def test_no_host_share_from_too_few_prefills_one_agent_or_impossible_times() -> None:
    prefill, decode = _crowded_window()
    assert host_share(prefill[:5], decode, num_agents=3, min_prefill_points=20) is None
    assert host_share(prefill, decode, num_agents=1, min_prefill_points=20) is None
    # Samples all stamped with one time (an agent that does not say when each ended):
    # more work at once than there are agents, so the times say nothing about crowding.
    stamped = [PrefillSample(9.0, p.input_tokens, 0, p.seconds) for p in prefill]
    assert host_share(stamped, decode, num_agents=3, min_prefill_points=20) is None


def _joins(host: str, other_host: str) -> list[Join]:
    return [
        Join(0, "p0", "prefill", f"{host}:1", "", "tcp", "tiny", 16, 10**6, 10**9, 0),
        Join(0, "p1", "prefill", f"{other_host}:2", "", "tcp", "tiny", 16, 10**6, 10**9, 0),
        Join(0, "d0", "decode", f"{host}:3", "", "tcp", "tiny", 16, 5 * 10**5, 10**9, 0),
    ]


def test_a_live_profile_of_one_host_holds_solo_times_and_its_cores() -> None:
    prefill, decode = _crowded_window()
    calibrator = Calibrator(COST)
    calibrator.add_prefill(prefill)
    calibrator.add_decode(decode)
    profile = live_profile(calibrator, _joins("127.0.0.1", "127.0.0.1"))
    assert profile["host"]["cores"] == pytest.approx(1.0, abs=0.051)
    point = next(p for p in profile["prefill_points"] if p["cached_tokens"] == 0)
    assert point["seconds"] == pytest.approx(_solo_s(point["input_tokens"]), rel=0.1)
    # Agents on two hosts do not crowd each other's cores: no host section, times as measured.
    assert "host" not in live_profile(calibrator, _joins("10.0.0.1", "10.0.0.2"))
