"""`kvcentric twin validate`: bad input named before any stack starts, and one short window
run live (its own stack per config) and in the twin, with the result's documented shape."""

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.bench.validate import (
    GOAL_BOUNDS,
    WAVE_BOUNDS,
    check_bounds,
    compare_runs,
    config_entry,
    earlier_runs,
    live_noise_chance,
    median_report,
    run_order,
)
from backend.observe.live_profile import profile_of_inputs
from backend.policy.cost_model import CostModel
from tests.harness.processes import alive, children_of

KVCENTRIC = str(Path(sys.executable).parent / "kvcentric")


def run(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [KVCENTRIC, "twin", "validate", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ("not json", "--changes is not valid JSON"),
        ('{"prefill": 1}', "--changes must be a JSON list of objects"),
        ('[{"thresold": 2}]', "change {\"thresold\": 2}: unknown setting 'thresold'"),
        (
            '[{"kvcache_balancing_threshold": 0.5}]',
            "kvcache_balancing_threshold must be in [1, inf]",
        ),
        ('[{"prefill": 0}]', "'prefill' must be a whole number >= 1"),
        ('[{"block_size": 64}]', "'block_size' is set by the validation, not a change"),
    ],
)
def test_a_malformed_change_is_a_clear_error_naming_it(changes, message) -> None:
    result = run("--minutes", "0:1", "--changes", changes, timeout_s=60)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr


def test_repeats_must_be_a_whole_number_of_at_least_one() -> None:
    for repeats, message in (("0", "--repeats must be at least 1"), ("two", "whole number")):
        result = run("--minutes", "0:1", "--repeats", repeats, timeout_s=60)
        assert result.returncode == 2 and message in result.stderr, result.stderr


def test_repeated_runs_compare_medians_and_say_whether_the_twin_is_within_live_spread() -> None:
    lives = [{"ttft_p50_s": 1.2, "num_rejected": 60}, {"ttft_p50_s": 2.0, "num_rejected": 130},
             {"ttft_p50_s": 1.6, "num_rejected": 90}]  # fmt: skip
    twins = [{"ttft_p50_s": 1.7, "num_rejected": 200}, {"ttft_p50_s": 1.8, "num_rejected": 210},
             {"ttft_p50_s": 1.75, "num_rejected": 190}]  # fmt: skip
    metrics = compare_runs(lives, twins)
    ttft = metrics["ttft_p50_s"]
    assert (ttft["live"], ttft["twin"]) == (1.6, 1.75)
    assert ttft["rel_err"] == pytest.approx(0.15 / 1.6)
    assert ttft["live_runs"] == [1.2, 2.0, 1.6] and ttft["within_live_spread"]
    rejected = metrics["num_rejected"]
    assert (rejected["live"], rejected["twin"]) == (90, 200) and not rejected["within_live_spread"]
    # One run: the documented shape, nothing more.
    assert set(compare_runs(lives[:1], twins[:1])["ttft_p50_s"]) == {"live", "twin", "rel_err"}


def test_repeated_runs_take_turns_so_the_hosts_drift_falls_on_every_config() -> None:
    # Round by round: the first run of each config, then the second of each, ...
    assert run_order(3, 2) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    assert run_order(2, 1) == [(0, 0), (1, 0)]


def test_lives_beliefs_reach_the_twin_on_its_clock_from_its_starting_model() -> None:
    from twin.cluster import LiveCalibration
    from twin.timing import read_profile

    def beliefs_on_twins_clock(inputs, zero_s):
        return LiveCalibration.of_inputs(
            inputs, zero_s=zero_s, last_refit_s=None, from_s=0.0
        ).beliefs

    base = CostModel.from_profile(read_profile("tiny-cpu")[0])
    refit = base.to_profile() | {"name": "refit"}
    kept = [{"time_s": 130.0, "cost": refit}]
    inputs = {"base": base.to_profile(), "window": {"beliefs": kept, "num_refits": 1}}
    # The first refit came 30 s into the replay: the starting model was believed until then.
    beliefs = beliefs_on_twins_clock(inputs, zero_s=100.0)
    assert beliefs == [(-math.inf, base), (30.0, CostModel.from_profile(refit))]
    # A refit from before the replay's start was in force at it: the starting model was not.
    assert beliefs_on_twins_clock(inputs, zero_s=140.0) == [
        (-math.inf, CostModel.from_profile(refit))
    ]
    # Refits the Conductor's window has let go came before the oldest kept one, which was in
    # force as its window began: it stands in for them, not the starting model.
    let_go = {"base": base.to_profile(), "window": {"beliefs": kept, "num_refits": 4}}
    assert beliefs_on_twins_clock(let_go, zero_s=100.0) == [
        (-math.inf, CostModel.from_profile(refit))
    ]
    # Kept before beliefs were: none, and the twin believes the warm-up's end's model.
    assert beliefs_on_twins_clock({"base": base.to_profile(), "window": {}}, zero_s=0.0) is None


def test_kept_calibration_settings_read_back_across_versions() -> None:
    from backend.policy.calibration import CalibrationConfig

    kept = {"refit_interval_s": 3.0, "refit_growth": 4.0, "a_setting_since_gone": 1}
    assert CalibrationConfig.from_json(kept) == CalibrationConfig(
        refit_interval_s=3.0, refit_growth=4.0
    )
    # Kept before a setting existed: it takes its default.
    assert CalibrationConfig.from_json({"refit_interval_s": 3.0}).refit_growth == 2.0


def test_the_twins_seeds_are_combined_metric_by_metric() -> None:
    runs = [
        {"ttft_mean_s": 0.30, "ttft_p50_s": 0.20, "cache_hit_ratio": 0.22, "requests": ["a"]},
        {"ttft_mean_s": 0.25, "ttft_p50_s": 0.24, "cache_hit_ratio": 0.20, "requests": ["b"]},
        {"ttft_mean_s": 0.27, "ttft_p50_s": 0.18, "cache_hit_ratio": 0.20, "requests": ["c"]},
    ]
    combined = median_report(runs)
    assert (combined["ttft_mean_s"], combined["ttft_p50_s"]) == (0.27, 0.20)
    assert combined["cache_hit_ratio"] == 0.20  # two seeds of three: the majority's
    assert combined["requests"] == ["c"]  # the run whose mean TTFT is the median's
    assert combined["seed_runs"]["ttft_p50_s"] == [0.20, 0.24, 0.18]
    assert median_report(runs[:1]) == runs[0]
    result = run("--minutes", "0:1", "--twin-seeds", "0", timeout_s=60)
    assert result.returncode == 2 and "--twin-seeds must be at least 1" in result.stderr


def _report(ttft_p50_s, tbt_p50_s, rejected, hit, num_requests=400):
    return {
        "ttft_p50_s": ttft_p50_s,
        "ttft_p90_s": 2 * ttft_p50_s,
        "tbt_p50_s": tbt_p50_s,
        "num_rejected": rejected,
        "cache_hit_ratio": hit,
        "num_requests": num_requests,
    }


def test_the_result_names_each_bound_the_twin_missed() -> None:
    configs = [
        # within every bound of the wave: 19 % TTFT, 14 % TBT, 3 rejections of 400 requests
        # (1 % is 4), 1.9 points
        config_entry({}, [_report(1.0, 0.010, 10, 0.200)], [_report(1.19, 0.0114, 13, 0.219)]),
        # rejections: 10 % of live's 100 allowed, 15 more; the hit ratio 2.5 points off
        config_entry(
            {"prefill": 1, "decode": 2},
            [_report(2.0, 0.010, 100, 0.200)],
            [_report(2.0, 0.010, 115, 0.225)],
        ),
    ]
    assert configs[0]["num_requests"] == 400
    wave = check_bounds(configs, 1.0, WAVE_BOUNDS)
    assert not wave["held"] and wave["checked"] == 2 * 5 + 1
    assert wave["missed"] == [
        '{"prefill": 1, "decode": 2}: num_rejected 115 against live\'s 100 (bound 10.0)',
        '{"prefill": 1, "decode": 2}: cache_hit_ratio +2.5 points (bound 2)',
    ]
    goal = check_bounds(configs, 0.67, GOAL_BOUNDS)
    assert "{}: ttft_p50_s +19.0% (bound 10%)" in goal["missed"]
    assert "{}: tbt_p50_s +14.0% (bound 5%)" in goal["missed"]
    assert goal["missed"][-1] == "all configs: kendall tau of ttft_mean_s 0.67 (bound >= 0.8)"
    # One config: no ranking to check; every item held.
    assert check_bounds(configs[:1], None, WAVE_BOUNDS) == {
        "held": True,
        "checked": 5,
        "missed": [],
    }


def test_live_noise_is_the_chance_a_twin_at_lives_median_holds_the_bounds() -> None:
    steady = [_report(1.0, 0.010, 10, 0.20) for _ in range(5)]
    # TBT p50 of 10 ms in three runs, 20 ms in two: a median of five runs drawn from them is
    # 20 ms (outside 15 % of the 10 ms median) when three or more draws are 20 ms,
    # P(Binomial(5, 0.4) >= 3) = 0.317.
    spread = [_report(1.0, tbt, 10, 0.20) for tbt in (0.010, 0.010, 0.010, 0.020, 0.020)]
    configs = [config_entry({}, steady, steady), config_entry({"prefill": 1}, spread, spread)]
    noise = live_noise_chance(configs, WAVE_BOUNDS)
    assert noise["chance_by_config"]["{}"] == 1.0
    assert noise["chance_by_config"]['{"prefill": 1}'] == pytest.approx(0.683, abs=0.01)
    assert noise["chance_by_item"]['{"prefill": 1}: tbt_p50_s'] == pytest.approx(0.683, abs=0.01)
    assert noise["chance_by_item"]['{"prefill": 1}: ttft_p50_s'] == 1.0
    assert noise["chance_all_held"] == pytest.approx(0.683, abs=0.01)
    assert check_bounds(configs, 1.0, WAVE_BOUNDS)["live_noise"] == noise
    # Two runs a config are too few to draw from: no figure, and check_bounds leaves it out.
    two = [config_entry({}, steady[:2], steady[:2])]
    assert live_noise_chance(two, WAVE_BOUNDS) is None
    assert "live_noise" not in check_bounds(two, None, WAVE_BOUNDS)


def test_an_slo_must_be_a_positive_number_of_seconds() -> None:
    for flag, value in (("--tbt-slo", "0"), ("--ttft-slo", "-1"), ("--tbt-slo", "fast")):
        result = run("--minutes", "0:1", flag, value, timeout_s=60)
        assert result.returncode == 2 and flag in result.stderr, result.stderr


def test_a_window_without_requests_is_a_clear_message(tmp_path) -> None:
    result = run("--minutes", "500:501", timeout_s=60)
    assert result.returncode == 2
    assert "holds no request" in result.stderr, result.stderr


@pytest.fixture(scope="module")
def short_set(tmp_path_factory) -> tuple[Path, dict, str]:
    """One short validate of two 2P:1D configurations, read by the tests below: its folder,
    its JSON and its stderr. Both configurations share a split, so the second run's
    prediction pools the first run's warm-up with its own (validate's default)."""
    out = tmp_path_factory.mktemp("short") / "validate"
    result = run(
        "--warmup-minutes", "0:0.15", "--minutes", "0.15:0.3", "--speed", "2",
        "--changes", '[{}, {"kvcache_balancing_threshold": "inf"}]', "--tbt-slo", "0.5",
        "--twin-seeds", "1", "--out", str(out), "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return out, json.loads(result.stdout), result.stderr


def repredict(out: Path, *flags: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """`kvcentric twin repredict OUT --twin-seeds 1 FLAGS...`: the kept runs predicted again."""
    return subprocess.run(
        [KVCENTRIC, "twin", "repredict", str(out), "--twin-seeds", "1", *flags],
        capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.slow
def test_a_short_window_live_and_in_the_twin(short_set, tmp_path) -> None:
    """Small and untimed: the figures of docs/fidelity.md come from longer windows."""
    out, report, stderr = short_set
    assert [c["change"] for c in report["configs"]] == [{}, {"kvcache_balancing_threshold": "inf"}]
    for config in report["configs"]:
        metrics = config["metrics"]
        for name in ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tbt_p50_s",
                     "tbt_p90_s", "num_completed", "num_rejected", "cache_hit_ratio",
                     "goodput_rps", "slo_attainment", "num_replicated_blocks"):  # fmt: skip
            assert set(metrics[name]) == {"live", "twin", "rel_err"}, name
        assert metrics["num_completed"]["live"] > 0
        live, twin = metrics["ttft_p50_s"]["live"], metrics["ttft_p50_s"]["twin"]
        assert metrics["ttft_p50_s"]["rel_err"] == pytest.approx((twin - live) / abs(live))
        speed = config["host_speed"]  # None where the short window measured too few prefills
        assert speed is None or set(speed) == {"warmup", "window", "drift", "runs"}
    assert set(report["kendall_tau"]) == {"ttft_mean_s", "goodput_rps"}
    assert set(report["directions"]) == {"right", "total"}
    assert set(report["bounds"]) == {"wave", "goal"}
    assert report["bounds"]["wave"]["checked"] == 2 * 5 + 1
    assert (out / "validate.html").read_text().count("plotly") > 0
    for index in (0, 1):
        folder = out / f"config-{index}"
        assert json.loads((folder / "live-report.json").read_text())["num_requests"] > 0
        assert json.loads((folder / "live-profile.json").read_text())["believed"]
        # --tbt-slo judged both sides: the live Conductor's SLO and the twin's.
        assert json.loads((folder / "live-report.json").read_text())["tbt_slo_s"] == 0.5
        assert json.loads((folder / "twin-report.json").read_text())["config"]["tbt_slo_s"] == 0.5
    assert "config 2/2" in stderr  # progress on stderr
    again = repredict(out, "--out", str(tmp_path / "again"), "--json")  # no live run
    assert again.returncode == 0, again.stderr[-3000:]
    repredicted = json.loads(again.stdout)
    assert repredicted["settings"]["repredicted_from"] == str(out)
    for before, after in zip(report["configs"], repredicted["configs"], strict=True):
        assert after["change"] == before["change"]
        for name, values in after["metrics"].items():
            assert values["live"] == before["metrics"][name]["live"], name  # live as kept
        assert after["host_speed"] == before["host_speed"]  # the kept measurements again
        assert after["metrics"]["ttft_p50_s"]["twin"] > 0
    assert json.loads((tmp_path / "again" / "result.json").read_text()) == repredicted
    assert "run 2/2" in again.stderr
    assert repredicted["settings"]["hindsight"] is False
    hindsight = repredict(out, "--hindsight", "--json")  # the calibration at the window's end
    assert hindsight.returncode == 0, hindsight.stderr[-3000:]
    seen = json.loads(hindsight.stdout)
    assert seen["settings"]["hindsight"] is True
    for before, after in zip(report["configs"], seen["configs"], strict=True):
        assert (
            after["metrics"]["num_completed"]["live"] == before["metrics"]["num_completed"]["live"]
        )
        assert after["metrics"]["ttft_p50_s"]["twin"] > 0
    whatif = repredict(out, "--whatif", "--json")  # as the What-if predicts a recorded window
    assert whatif.returncode == 0, whatif.stderr[-3000:]
    assert json.loads(whatif.stdout)["settings"]["as_whatif"] is True
    decode_seen = repredict(out, "--hindsight-of", "decode", "--json")  # the window's decode
    assert decode_seen.returncode == 0, decode_seen.stderr[-3000:]
    assert json.loads(decode_seen.stdout)["settings"]["hindsight_of"] == ["decode"]
    unknown = repredict(out, "--hindsight-of", "decode,decoder")
    assert unknown.returncode == 2 and "unknown profile part 'decoder'" in unknown.stderr
    both = repredict(out, "--whatif", "--hindsight")
    assert both.returncode == 2 and "--hindsight and --whatif" in both.stderr, both.stderr
    rebuilt = repredict(out, "--rebuild-profile", "--json")  # from the kept measurements
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert json.loads(rebuilt.stdout)["settings"]["rebuilt_profile"] is True
    kept = json.loads((out / "config-0" / "live-run.json").read_text())["calibration"]
    assert profile_of_inputs(kept["profile_inputs"]) == kept["profile"]
    # The agents' host CPU counters came with their heartbeats and were kept.
    counters = kept["profile_inputs"]["window"]["host_cpu"]
    assert counters and len({c["host_id"] for c in counters}) == 1
    # What live's Conductor believed when came too (the twin's replay of the warm-up reads it).
    assert all(b["cost"]["prefill"] for b in kept["profile_inputs"]["window"]["beliefs"])


def test_a_run_pools_the_warmups_that_ran_before_it_on_its_split() -> None:
    """Round by round (`run_order`): run 1 of the second config pools every earlier run of
    the 2P:1D split, whatever its policy, and none of 1P:2D's; by configuration, its own."""
    splits = [[2, 1], [2, 1], [1, 2]]
    runs = [
        {"index": i, "run": r, "live": {"split": split, "name": f"{i}/{r}"}}
        for i, r in run_order(len(splits), 2)
        for split in [splits[i]]
    ]

    def names(across: str) -> list[str]:
        return [live["name"] for live in earlier_runs(runs, 1, 1, (2, 1), across)]

    assert names("split") == ["0/0", "1/0", "0/1"]
    assert names("config") == ["1/0"]
    assert earlier_runs(runs, 0, 0, (2, 1), "split") == []  # the very first run: its own
    with pytest.raises(ValueError, match="one of split, config"):
        earlier_runs(runs, 1, 1, (2, 1), "policy")


@pytest.mark.slow
def test_pooled_warmups_predict_from_this_and_the_earlier_runs_warmups(short_set) -> None:
    """Pooled by split (the default): the first run has no earlier one and predicts from its
    own warm-up, the second from both warm-ups; `repredict` predicts the kept runs alike, or
    each from its own warm-up with `--own-warmup`."""
    out, report, _ = short_set
    assert report["settings"]["pool_warmups"] is True
    assert report["settings"]["pool_across"] == "split"  # every earlier run of its split

    def twins(*flags: str) -> list[list]:
        again = repredict(out, *flags, "--json")
        assert again.returncode == 0, again.stderr[-3000:]
        return _twin_figures(json.loads(again.stdout))

    kept = _twin_figures(report)
    assert twins() == twins("--pool-warmups") == kept
    own = twins("--own-warmup")  # each run from its own warm-up alone
    assert own[0] == kept[0]  # the first run pooled nothing but its own
    assert own[1] != kept[1]  # the second pooled the first's warm-up with its own
    both = repredict(out, "--pool-warmups", "--hindsight")
    assert both.returncode == 2 and "not with --hindsight" in both.stderr, both.stderr


def _twin_figures(result: dict) -> list[list]:
    """Each configuration's twin TTFT p50 and refusals: what a prediction's warm-ups move."""
    return [
        [config["metrics"][name]["twin"] for name in ("ttft_p50_s", "num_rejected")]
        for config in result["configs"]
    ]


def test_repredict_names_a_folder_validate_did_not_write(tmp_path) -> None:
    result = subprocess.run(
        [KVCENTRIC, "twin", "repredict", str(tmp_path)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 2
    assert "not a `twin validate --out` folder" in result.stderr, result.stderr


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for children")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_validate_stops_the_stack_it_runs(signum) -> None:
    """SIGTERM (a job cancelled, `timeout`) or SIGINT in the middle of a window: the
    Conductor, the agents and the replay stop with it (they run in sessions of their own, so
    they never see the signal); before, SIGTERM left them running. Started as a background
    job is, ignoring SIGINT, which Python would go on ignoring unless told."""
    process = subprocess.Popen(
        [KVCENTRIC, "twin", "validate", "--warmup-minutes", "0:0.15", "--minutes", "0.15:2",
         "--speed", "3", "--changes", "[{}]", "--tbt-slo", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    lines = []
    try:
        assert process.stderr is not None
        for line in process.stderr:  # statuses, one a line where stderr is not a terminal
            lines.append(line)
            if "replaying the measured window" in line:
                break
        deadline = time.monotonic() + 30
        while len(children := children_of(process.pid)) < 5 and time.monotonic() < deadline:
            time.sleep(0.1)  # the window's replay starts just after its status line
        assert len(children) == 5, (children, lines)  # conductor, 2P + 1D, the replay
        process.send_signal(signum)
        rest = process.stderr.read()
        assert process.wait(timeout=60) == 130, rest
        assert "interrupted; the stack it was running is stopped" in rest, rest
        left = {pid: _described(pid) for pid in children if alive(pid)}
        assert not left, (left, rest)  # which were left, in what state, and what it said
    finally:
        if process.poll() is None:  # a failed assertion: stop it as a user would
            process.terminate()
            process.wait(timeout=60)


def _described(pid: int) -> str:
    """A process's state and command line from /proc, for a failure message."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError as error:
        return f"gone ({error})"
    return f"state {state[0]}, parent {state[1]}: {command[:200]}"
