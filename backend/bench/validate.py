"""`kvcentric twin validate`: a window run live and in the twin, metric by metric.

For each change (policy settings by their PolicyConfig names, `prefill`/`decode` for the
split; `{}` is the base) it starts its own stack on this machine as `kvcentric up` does
(Conductor on SQLite, `tiny` agents), replays the warm-up window (the calibration's data),
takes the Conductor's calibration as of then (GET /v1/calibration: the live profile, with
the model the policy believed), replays the measured window, exports warm-up and window,
and predicts the window with the twin on that profile (the twin replays the warm-up first,
to warm its caches and queues, and reports the window only). The twin never sees what the
window measured.
"""

import dataclasses
import itertools
import json
import math
import shutil
import statistics
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from backend.bench import host_speed
from backend.cli.children import (
    KVCENTRIC,
    WARMUP_TOKENS,
    Child,
    get_json,
    spawn_into,
    start_local_stack,
)
from backend.observe.live_profile import check_parts, with_parts
from backend.observe.measures import FIDELITY_METRICS, relative_error
from backend.policy.config import PolicyConfig, json_safe, policy_from_json
from backend.traces.loader import TraceRow, iter_trace, load_trace, parse_minutes

if TYPE_CHECKING:
    from twin.cluster import LiveCalibration

RANKED = ("ttft_mean_s", "goodput_rps")
SPLIT_KEYS = ("prefill", "decode")
POLICY_KEYS = tuple(f.name for f in dataclasses.fields(PolicyConfig))
# Set by the validation itself, never by a change: the window's block size and the SLOs.
FIXED_KEYS = ("block_size", "ttft_slo_s", "tbt_slo_s")

OnStatus = Callable[[str, float], None]


@dataclasses.dataclass(frozen=True, slots=True)
class Bounds:
    """How far the twin may be from live for a config to count as predicted (issue 11's
    acceptance, docs/fidelity.md): TTFT p50/p90 and TBT p50 relative errors, the token hit
    ratio in points, rejections within max(10 % of live's count, 1 % of the window's
    requests), and Kendall's tau of mean TTFT over the configs."""

    name: str
    ttft_rel: float
    tbt_rel: float
    min_tau: float
    hit_ratio_points: float = 0.02
    rejected_rel: float = 0.10
    rejected_share_of_requests: float = 0.01


# Whose warm-ups a run's prediction pools (`earlier_runs`); the first is validate's.
POOL_ACROSS = ("split", "config")
WAVE_BOUNDS = Bounds("wave", ttft_rel=0.20, tbt_rel=0.15, min_tau=0.6)  # this wave's
GOAL_BOUNDS = Bounds("goal", ttft_rel=0.10, tbt_rel=0.05, min_tau=0.8)  # the goal (BLIS-like)


@dataclasses.dataclass(frozen=True, slots=True)
class ValidateSettings:
    """What to replay and on which stack."""

    trace: Path
    warmup_minutes: str | None
    minutes: str
    speed: float
    length_scale: float
    block_size: int
    num_prefill: int
    num_decode: int
    ttft_slo_s: float
    tbt_slo_s: float
    profile: str = "tiny-cpu"
    # Live runs per config: one run's figures move between runs of the same config (at
    # speed 8 here TTFT p50 1.26 s and 1.94 s), so metrics compare medians over repeats.
    repeats: int = 1
    # Twin runs per prediction, each with its own seed for the drawn durations and delays
    # (twin/spread.py): one seed's TTFT p50 moves by about 5 % from the next, so the
    # prediction is each metric's median over the seeds.
    twin_seeds: int = 21  # under overload a median of 5 moved 10-23 % (docs/fidelity.md)
    # Each run predicted from its warm-up and those of the earlier runs (`warmups_profile`):
    # a short warm-up's measurements of the host move more from run to run than live does
    # (machine A at speed 10: three sets held 21, 21, 20 wave bounds so, 20, 21, 19 from each
    # run's own warm-up; docs/fidelity.md).
    pool_warmups: bool = True
    # Whose warm-ups a run pools (`POOL_ACROSS`): every earlier run of its prefill:decode
    # split, whatever its policy ("split"), or its configuration's alone ("config", what
    # validate did before 2026-12-07 and what repredict reads a set kept then as).
    pool_across: str = POOL_ACROSS[0]

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {self.repeats}")
        if self.twin_seeds < 1:
            raise ValueError(f"--twin-seeds must be at least 1, got {self.twin_seeds}")
        if self.pool_across not in POOL_ACROSS:
            raise ValueError(f"pool_across must be one of {', '.join(POOL_ACROSS)}")


def parse_changes(text: str) -> list[dict[str, Any]]:
    """The changes of `--changes` (a JSON list of objects; `{}` first is added when absent);
    ValueError naming the bad change and key."""
    try:
        changes = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--changes is not valid JSON: {error}") from None
    if not isinstance(changes, list) or not all(isinstance(c, dict) for c in changes):
        raise ValueError('--changes must be a JSON list of objects, e.g. [{}, {"prefill": 1}]')
    if {} not in changes:
        changes.insert(0, {})
    for change in changes:
        check_change(change)
    return changes


def check_change(change: Mapping[str, Any]) -> None:
    """ValueError naming the change and what is wrong with it."""
    shown = json.dumps(change)
    for key in change:
        if key in FIXED_KEYS:
            raise ValueError(f"change {shown}: {key!r} is set by the validation, not a change")
        if key not in POLICY_KEYS and key not in SPLIT_KEYS:
            raise ValueError(
                f"change {shown}: unknown setting {key!r}; use PolicyConfig names "
                f"({', '.join(k for k in POLICY_KEYS if k not in FIXED_KEYS)}) or "
                f"{' / '.join(SPLIT_KEYS)}"
            )
    for key in SPLIT_KEYS:
        value = change.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"change {shown}: {key!r} must be a whole number >= 1")
    policy = policy_from_json({k: v for k, v in change.items() if k in POLICY_KEYS})
    try:
        PolicyConfig(**policy)
    except (TypeError, ValueError) as error:
        raise ValueError(f"change {shown}: {error}") from None


def env_of_change(change: Mapping[str, Any]) -> dict[str, str]:
    """The Conductor's KVC_* variables that apply a change's policy settings."""
    env = {}
    for key, value in json_safe(dict(change)).items():
        if key in POLICY_KEYS:
            env[f"KVC_{key.upper()}"] = json.dumps(value) if isinstance(value, bool) else str(value)
    return env


# -- one config, live --------------------------------------------------------------------------
# The calibration with the inputs of its live profile, so a kept run can be predicted again
# on a profile the code of the day builds (`repredict(rebuild_profile=True)`).
CALIBRATION_PATH = "/v1/calibration?max_points=0&inputs=true"


def run_live(
    settings: ValidateSettings,
    change: Mapping[str, Any],
    work_dir: Path,
    on_status: Callable[[str], None],
) -> dict[str, Any]:
    """Start a stack, replay warm-up then window; the live report, the exported window, the
    calibration as of the end of warm-up and the policy in force."""
    num_prefill = int(change.get("prefill", settings.num_prefill))
    num_decode = int(change.get("decode", settings.num_decode))
    on_status(f"starting a conductor and {num_prefill}P+{num_decode}D tiny agents")
    stack = start_local_stack(
        work_dir,
        num_prefill=num_prefill,
        num_decode=num_decode,
        block_size=settings.block_size,
        profile=settings.profile,
        warmup_tokens=WARMUP_TOKENS,
        env={
            "KVC_TTFT_SLO_S": f"{settings.ttft_slo_s:.6f}",
            "KVC_TBT_SLO_S": f"{settings.tbt_slo_s:.6f}",
            **env_of_change(change),
        },
    )
    base_url, api_key, env, children = stack.base_url, stack.api_key, stack.env, stack.children
    try:
        warmup_start_s = time.time()
        if settings.warmup_minutes:
            on_status(f"replaying the warm-up, minutes {settings.warmup_minutes}")
            _replay(settings, settings.warmup_minutes, base_url, env, work_dir / "warmup", children)
        calibration = _get(base_url, CALIBRATION_PATH, api_key)
        policy = _get(base_url, "/v1/config", api_key)
        on_status(f"replaying the measured window, minutes {settings.minutes}")
        start_s = time.time()
        _replay(settings, settings.minutes, base_url, env, work_dir / "window", children)
        end_s = time.time()
        time.sleep(0.5)  # the last outcomes reach the database
        query = urllib.parse.urlencode({"start_s": start_s, "end_s": end_s})
        report = _get(base_url, f"/v1/report?{query}", api_key)
        # The warm-up too: the twin replays it to warm its caches and queues as live had them,
        # and reports the measured window only.
        export = urllib.parse.urlencode(
            {"start_s": warmup_start_s, "end_s": end_s, "block_size": settings.block_size}
        )
        rows_text = _get_text(base_url, f"/v1/export/trace?{export}", api_key)
        calibration_after = _get(base_url, CALIBRATION_PATH, api_key)
    finally:
        stack.stop()
    return {
        "ttfts_s": _recorded_ttfts(work_dir / "data", start_s, end_s),
        "report": report,
        "trace": rows_text,
        "window_from_ms": (start_s - warmup_start_s) * 1000.0,
        "calibration": calibration,
        "calibration_after": calibration_after,
        "policy": policy,
        "split": (num_prefill, num_decode),
    }


def _recorded_ttfts(data_dir: Path, start_s: float, end_s: float) -> list[float]:
    """Every completed request's TTFT in the window, as the Conductor recorded it."""
    from backend.db.request_log import list_requests
    from backend.db.session import create_db_engine, create_session_factory

    engine = create_db_engine(f"sqlite:///{(data_dir / 'kvcentric.db').as_posix()}")
    try:
        with create_session_factory(engine)() as session:
            requests = list_requests(session=session, start_s=start_s, end_s=end_s)
    finally:
        engine.dispose()
    return sorted(
        r.outcome.ttft_s
        for r in requests
        if r.outcome is not None and r.outcome.state == "completed" and r.outcome.ttft_s
    )


def _replay(
    settings: ValidateSettings,
    minutes: str,
    base_url: str,
    env: dict[str, str],
    out: Path,
    children: list[Child],
) -> None:
    running: list[Child] = []  # the replay, once it runs
    try:
        replay = spawn_into(running, lambda: _replay_child(settings, minutes, base_url, env, out))
        while replay.process.poll() is None:
            for child in children:
                child.check_alive()
            time.sleep(0.5)
    finally:  # a failed or interrupted validate stops its replay too
        for child in running:
            child.terminate()
            child.wait()
    if replay.process.returncode != 0:
        raise RuntimeError(f"the replay of minutes {minutes} failed; see {replay.log}")


def _replay_child(
    settings: ValidateSettings, minutes: str, base_url: str, env: dict[str, str], out: Path
) -> Child:
    return Child(
        "replay",
        [
            KVCENTRIC,
            "replay",
            "--url",
            base_url,
            "--trace",
            str(settings.trace),
            "--minutes",
            minutes,
            "--length-scale",
            str(settings.length_scale),
            "--speed",
            str(settings.speed),
            "--out",
            str(out.with_suffix(".jsonl")),
        ],
        env,
        out.with_suffix(".log"),
        stdout_pipe=False,
    )


def _get(base_url: str, path: str, api_key: str) -> Any:
    value = get_json(f"{base_url}{path}", api_key)
    if value is None:
        raise RuntimeError(f"GET {path} did not answer")
    return value


def _get_text(base_url: str, path: str, api_key: str) -> str:
    request = urllib.request.Request(
        f"{base_url}{path}", headers={"Authorization": f"Bearer {api_key}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read().decode()


# -- the twin's prediction -------------------------------------------------------------------
# How a kept run is read: as a prediction (the profile and live's beliefs as of the end of
# warm-up), with hindsight (the window's end's profile, the warm-up's beliefs) or as the
# console's What-if reads a recorded window (the window's end's profile, live's beliefs over
# warm-up and window). `repredict` explains each.
Reading = Literal["prediction", "hindsight", "whatif"]


def predict(
    live: Mapping[str, Any],
    block_size: int,
    work_dir: Path,
    *,
    seeds: int = 1,
    reading: Reading = "prediction",
    hindsight_of: Sequence[str] = (),
    warmup_profile: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The twin's report of the measured window, after replaying the warm-up (its requests
    are not reported), on the live profile of the end of warm-up (of the window's end when
    `reading` is not "prediction"; a prediction's `hindsight_of` parts of the profile, as
    `with_parts` names them, too); with `seeds` > 1, the median report of that many seeds
    (`median_report`). `warmup_profile`: a prediction's profile instead of the warm-up's
    own (`warmups_profile`)."""
    from twin.config import TwinConfig
    from twin.run import simulate

    rows = _rows(live["trace"], block_size, work_dir)
    if not rows:
        raise ValueError("the measured window recorded no request; replay a longer window")
    profile_path = work_dir / "live-profile.json"
    profiled = live["calibration"] if reading == "prediction" else live["calibration_after"]
    profile = profiled["profile"]
    if warmup_profile is not None and reading == "prediction":
        profile = warmup_profile
    if hindsight_of and reading == "prediction":
        profile = with_parts(profile, live["calibration_after"]["profile"], hindsight_of)
    profile_path.write_text(json.dumps(profile))
    num_prefill, num_decode = live["split"]
    config = TwinConfig.of_live_policy(
        live["policy"]["config"],
        num_prefill=num_prefill,
        num_decode=num_decode,
        profile=str(profile_path),
        series_interval_s=max(1.0, float(live["report"].get("interval_s") or 1.0)),
    )
    if config.block_size != block_size:
        raise ValueError(f"the Conductor ran block size {config.block_size}, not {block_size}")
    measure_from_s = (live["window_from_ms"] - rows[0].timestamp_ms) / 1000.0
    end_s = (rows[-1].timestamp_ms - rows[0].timestamp_ms) / 1000.0
    calibration = _live_calibration(live, rows[0].timestamp_ms, measure_from_s, end_s, reading)
    reports = [
        simulate(
            config.with_changes(seed=config.seed + seed),
            rows,
            trace_label="recorded window",
            measure_from_s=measure_from_s,
            live_calibration=calibration,
        )
        for seed in range(seeds)
    ]
    return median_report(reports)


def _live_calibration(
    live: Mapping[str, Any],
    first_row_ms: float,
    measure_from_s: float,
    end_s: float,
    reading: Reading,
) -> "LiveCalibration | None":
    """What live's Conductor believed, on the twin's clock (zero at the first exported row,
    which the export timed from the warm-up's start): over the warm-up, from the beliefs it
    kept as the window began; or, read as the What-if reads a run, until the window's last
    arrival, from those it kept at the window's end. None for runs kept before their
    calibration's inputs were (the twin then calibrates on its own replay)."""
    from twin.cluster import LiveCalibration

    whatif = reading == "whatif"
    calibration = live["calibration_after"] if whatif else live["calibration"]
    inputs = calibration.get("profile_inputs")
    if inputs is None:
        return None
    warmup_start_s = float(live["report"]["start_s"]) - live["window_from_ms"] / 1000.0
    last_refit_s = calibration.get("last_refit_s")
    return LiveCalibration.of_inputs(
        inputs,
        zero_s=warmup_start_s + first_row_ms / 1000.0,
        last_refit_s=None if last_refit_s is None else float(last_refit_s),
        from_s=end_s if whatif else measure_from_s,
    )


def median_report(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One report of several twin runs of one window: each fidelity metric is the median
    over the runs (listed in `seed_runs`); the rest (requests, series, plots' data) is the
    run whose mean TTFT lies nearest that median, so it stays one coherent run."""
    if len(reports) == 1:
        return dict(reports[0])
    medians = {name: _median([r.get(name) for r in reports]) for name in FIDELITY_METRICS}
    center = medians["ttft_mean_s"]
    nearest = min(
        reports,
        key=lambda r: abs((r.get("ttft_mean_s") or 0.0) - center) if center is not None else 0,
    )
    combined = {**nearest, **medians}
    combined["seed_runs"] = {name: [r.get(name) for r in reports] for name in FIDELITY_METRICS}
    return combined


def _rows(text: str, block_size: int, work_dir: Path) -> list[TraceRow]:
    path = work_dir / "window.jsonl"
    path.write_text(text)
    return list(iter_trace(path, block_size))


# -- comparing ---------------------------------------------------------------------------------
def compare_metrics(live: Mapping[str, Any], twin: Mapping[str, Any]) -> dict[str, Any]:
    """{metric: {"live": x, "twin": y, "rel_err": (y - x) / |x|}} (rel_err None when x is 0)."""
    return compare_runs([live], [twin])


def compare_runs(
    lives: Sequence[Mapping[str, Any]], twins: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """compare_metrics over repeated runs of one config: `live` and `twin` are the medians
    of the runs' figures; with more than one run, `live_runs` and `twin_runs` list them all
    and `within_live_spread` says whether the twin's median lies within live's runs."""
    compared = {}
    for name in FIDELITY_METRICS:
        live_runs = [report.get(name) for report in lives]
        twin_runs = [report.get(name) for report in twins]
        x, y = _median(live_runs), _median(twin_runs)
        compared[name] = {"live": x, "twin": y, "rel_err": relative_error(x, y)}
        if len(lives) > 1:
            known = [v for v in live_runs if v is not None]
            compared[name].update(
                live_runs=live_runs,
                twin_runs=twin_runs,
                within_live_spread=bool(known) and y is not None and min(known) <= y <= max(known),
            )
    return compared


def config_entry(
    change: Mapping[str, Any],
    lives: Sequence[Mapping[str, Any]],
    twins: Sequence[Mapping[str, Any]],
    speeds: Sequence[dict[str, float] | None] = (),
) -> dict[str, Any]:
    """One config of the result: its change, the window's requests live (the median over
    runs; the rejection bound counts them), the compared metrics and, from `speeds` (one
    per run, `host_speed.host_speeds`), how fast the host ran its warm-ups and windows."""
    return {
        "change": dict(change),
        "num_requests": _median([report.get("num_requests") for report in lives]),
        "metrics": compare_runs(lives, twins),
        "host_speed": host_speed.summary(speeds),
    }


def speeds_by_config(
    entries: Sequence[Mapping[str, Any]],
) -> dict[int, list[dict[str, float] | None]]:
    """Every run's host speed (`host_speed.host_speeds`, one yardstick for the whole set),
    by config index, in run order; `entries` as validate's raw runs (index, live)."""
    speeds = host_speed.host_speeds(
        [
            (host_speed.prefill_samples(e["live"]), float(start_s))
            if (start_s := e["live"]["report"].get("start_s")) is not None
            else ((), 0.0)
            for e in entries
        ]
    )
    by_index: dict[int, list[dict[str, float] | None]] = {}
    for entry, speed in zip(entries, speeds, strict=True):
        by_index.setdefault(entry["index"], []).append(speed)
    return by_index


BOUNDED = ("ttft_p50_s", "ttft_p90_s", "tbt_p50_s", "num_rejected", "cache_hit_ratio")
LIVE_NOISE_RESAMPLES = 20_000


def allowed_gap(name: str, bounds: Bounds, live: Any, num_requests: float) -> Any:
    """The largest |twin - live| `bounds` allow for the metric `name` (one of BOUNDED);
    takes a float or a numpy array of live values alike."""
    if name == "num_rejected":
        share = bounds.rejected_share_of_requests * num_requests
        return np.maximum(bounds.rejected_rel * live, share)
    if name == "cache_hit_ratio":
        return bounds.hit_ratio_points + 1e-12
    return _relative_bound(name, bounds) * abs(live)


def within_bound(name: str, bounds: Bounds, live: Any, other: Any, num_requests: float) -> Any:
    """Whether `other` lies within `bounds` of `live` for `name`; floats or arrays alike."""
    return abs(other - live) <= allowed_gap(name, bounds, live, num_requests)


def _relative_bound(name: str, bounds: Bounds) -> float:
    return bounds.tbt_rel if name == "tbt_p50_s" else bounds.ttft_rel


def check_bounds(
    configs: Sequence[Mapping[str, Any]], tau: float | None, bounds: Bounds
) -> dict[str, Any]:
    """Which of `bounds` the result holds: `held` (every item), `checked`, `missed` (one
    line per item outside its bound, naming the config, the error and the bound) and, with
    three or more live runs a config, `live_noise` (`live_noise_chance`)."""
    missed: list[str] = []
    checked = 0
    for config in configs:
        label = json.dumps(config["change"])
        num_requests = config.get("num_requests") or 0
        for name in BOUNDED:
            live, twin = config["metrics"][name]["live"], config["metrics"][name]["twin"]
            absolute = name in ("num_rejected", "cache_hit_ratio")
            if absolute and None in (live, twin):
                continue  # not recorded on one side: nothing to check
            checked += 1
            if live is None or twin is None or (not absolute and live == 0):
                missed.append(f"{label}: {name} unknown (no relative error)")
            elif not within_bound(name, bounds, live, twin, num_requests):
                missed.append(f"{label}: {_miss(name, bounds, live, twin, num_requests)}")
    if len(configs) > 1:
        checked += 1
        if tau is None or tau < bounds.min_tau:
            shown = "unknown" if tau is None else f"{tau:.2f}"
            missed.append(
                f"all configs: kendall tau of ttft_mean_s {shown} (bound >= {bounds.min_tau:g})"
            )
    verdict: dict[str, Any] = {"held": not missed, "checked": checked, "missed": missed}
    noise = live_noise_chance(configs, bounds)
    if noise is not None:
        verdict["live_noise"] = noise
    return verdict


def _miss(name: str, bounds: Bounds, live: float, twin: float, num_requests: float) -> str:
    if name == "num_rejected":
        allowed = float(allowed_gap(name, bounds, live, num_requests))
        return f"num_rejected {twin:g} against live's {live:g} (bound {allowed:.1f})"
    if name == "cache_hit_ratio":
        points = 100 * (twin - live)
        return f"cache_hit_ratio {points:+.1f} points (bound {100 * bounds.hit_ratio_points:g})"
    bound = _relative_bound(name, bounds)
    return f"{name} {(twin - live) / abs(live):+.1%} (bound {bound:.0%})"


def live_noise_chance(
    configs: Sequence[Mapping[str, Any]], bounds: Bounds, *, seed: int = 0
) -> dict[str, Any] | None:
    """How far live's own run-to-run spread lets any twin meet `bounds`: the chance that
    the median of as many live runs as each config has, drawn again from its runs, lies
    within the bound of the median of them all, on every bounded metric at once (the runs
    drawn together, so correlated metrics stay so). That is what a twin that predicted
    exactly the median of live's runs could expect to hold. `chance_all_held` multiplies
    the configs' chances (their runs are independent; Kendall's tau is left out);
    `chance_by_config` and `chance_by_item` (label: metric) give the parts. None when a
    config has fewer than three live runs of every bounded metric."""
    rng = np.random.default_rng(seed)
    by_config: dict[str, float] = {}
    by_item: dict[str, float] = {}
    for config in configs:
        metrics = config["metrics"]
        runs = {name: metrics[name].get("live_runs") for name in BOUNDED}
        if any(r is None or len(r) < 3 or None in r for r in runs.values()):
            return None
        label = json.dumps(config["change"])
        num_runs = len(runs["ttft_p50_s"])
        picks = rng.integers(0, num_runs, (LIVE_NOISE_RESAMPLES, num_runs))
        held_all = np.ones(LIVE_NOISE_RESAMPLES, dtype=bool)
        for name, values in runs.items():
            values_array = np.asarray(values, dtype=float)
            medians = np.median(values_array[picks], axis=1)
            center = float(np.median(values_array))
            held = within_bound(name, bounds, center, medians, config.get("num_requests") or 0)
            by_item[f"{label}: {name}"] = round(float(held.mean()), 3)
            held_all &= held
        by_config[label] = round(float(held_all.mean()), 3)
    return {
        "chance_all_held": round(float(np.prod(list(by_config.values()))), 4),
        "chance_by_config": by_config,
        "chance_by_item": by_item,
    }


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(statistics.median(known)) if known else None


def kendall_tau(xs: Sequence[float | None], ys: Sequence[float | None]) -> float | None:
    """Kendall's tau-b of two rankings (pairs with a missing value are left out)."""
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if x is not None and y is not None]
    concordant = discordant = ties_x = ties_y = 0
    for (x1, y1), (x2, y2) in itertools.combinations(pairs, 2):
        dx, dy = x1 - x2, y1 - y2
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            ties_x += 1
        elif dy == 0:
            ties_y += 1
        elif (dx > 0) == (dy > 0):
            concordant += 1
        else:
            discordant += 1
    n = concordant + discordant
    denominator = math.sqrt((n + ties_x) * (n + ties_y))
    return (concordant - discordant) / denominator if denominator else None


def directions(configs: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How often the twin moves a metric the way live moved it from the base config."""
    base = configs[0]["metrics"]
    right = total = 0
    for config in configs[1:]:
        for name in FIDELITY_METRICS:
            live_base, twin_base = base[name]["live"], base[name]["twin"]
            live, twin = config["metrics"][name]["live"], config["metrics"][name]["twin"]
            if None in (live_base, twin_base, live, twin) or live == live_base:
                continue
            total += 1
            right += (live > live_base) == (twin > twin_base) and twin != twin_base
    return {"right": right, "total": total}


def run_order(num_changes: int, repeats: int) -> list[tuple[int, int]]:
    """(config index, run) in the order validate runs them: round by round, every config
    once a round, so a slow spell of the host (its speed drifts over tens of minutes on
    these machines) falls on every configuration alike instead of on one, and the
    configurations' live order (the Kendall tau) is not the host's drift."""
    return [(index, run) for run in range(repeats) for index in range(num_changes)]


def validate(
    settings: ValidateSettings,
    changes: Sequence[Mapping[str, Any]],
    *,
    out: Path | None = None,
    on_status: OnStatus | None = None,
) -> dict[str, Any]:
    """Run every change live and in the twin; the result object `--json` prints."""
    window = load_trace(settings.trace, minutes=parse_minutes(settings.minutes))
    if not window:
        raise ValueError(
            f"the window {settings.minutes} of {settings.trace} holds no request; "
            "choose minutes the trace covers"
        )
    raw = []
    by_index: dict[int, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    repeats = settings.repeats
    order = run_order(len(changes), repeats)
    with tempfile.TemporaryDirectory(prefix="kvc-validate-") as folder:
        for position, (index, run) in enumerate(order):
            change = changes[index]
            label = f"config {index + 1}/{len(changes)} {json.dumps(change)}"
            if repeats > 1:
                label += f" run {run + 1}/{repeats}"

            def status(text: str, i: int = position, label: str = label) -> None:
                if on_status is not None:
                    on_status(f"{label}: {text}", i)

            work_dir = Path(folder) / f"config-{index}" / f"run-{run}"
            live = run_live(settings, change, work_dir, status)
            status("predicting the window with the twin")
            earlier = earlier_runs(raw, index, run, live["split"], settings.pool_across)
            twin = predict(
                live,
                settings.block_size,
                work_dir,
                seeds=settings.twin_seeds,
                warmup_profile=warmups_profile(live, earlier) if settings.pool_warmups else None,
            )
            if not live["report"].get("num_completed"):
                raise ValueError(
                    f"change {json.dumps(change)}: no request completed in the measured "
                    "window live; nothing to compare (replay a longer window or slower)"
                )
            lives, twins = by_index.setdefault(index, ([], []))
            lives.append(live["report"])
            twins.append(twin)
            raw.append(
                {"change": dict(change), "index": index, "run": run, "live": live, "twin": twin}
            )
        speeds = speeds_by_config(raw)
        configs = [
            config_entry(changes[index], *by_index[index], speeds.get(index, ()))
            for index in range(len(changes))
        ]
        settings_json = {
            **{k: v for k, v in dataclasses.asdict(settings).items() if k != "trace"},
            "trace": str(settings.trace),
        }
        result = _result(settings_json, configs)
        if out is not None:  # while the work folders (live databases, logs) still exist
            write_outputs(result, raw, out, work=Path(folder))
    return result


def repredict(
    kept: Path,
    *,
    seeds: int,
    hindsight: bool = False,
    hindsight_of: Sequence[str] = (),
    as_whatif: bool = False,
    rebuild_profile: bool = False,
    pool_warmups: bool | None = None,
    out: Path | None = None,
    on_status: OnStatus | None = None,
) -> dict[str, Any]:
    """Predict again the live runs a `validate --out` kept in `kept`, with this twin and no
    live run: what a change to the twin does to its fidelity, on the very windows it was
    measured against (a validate of four configs takes minutes of live runs; this, seconds).
    The result has validate's shape; `settings.twin_seeds` is `seeds`.

    `hindsight`: the twin reads the live profile as of the window's end (the calibration
    window then holds the warm-up and the measured window) instead of the warm-up's end.
    Not a prediction, since it has seen the window: the twin's own error apart from how far
    the host's speed moved between warm-up and window (`settings.hindsight`).

    `hindsight_of`: only these parts of the profile as of the window's end (`with_parts`:
    prefill, decode, host, serving, link), the rest as of the warm-up's end: which of the
    warm-up's measurements a prediction's error comes from (`settings.hindsight_of`).

    `as_whatif`: predict each kept run as the console's What-if predicts a recorded window:
    the twin reads the live profile as of the window's end and believes what live's
    Conductor believed over the warm-up and the window, each model from when live did,
    then calibrates on its own (`settings.as_whatif`). How far the What-if's "current" run
    is from what live measured.

    `rebuild_profile`: build each live profile again from the measurements the run kept
    (`profile_inputs`) with this code, instead of reading the profile live built: what a
    change to how profiles are built does (`settings.rebuilt_profile`).

    `pool_warmups`: each run's profile built from its warm-up and those of the earlier
    runs of its split (`warmups_profile`, `earlier_runs`), as validate predicts by default;
    False: from its own warm-up alone; None: as the kept validate did (its own warm-up
    for sets kept before warm-ups were pooled, its configuration's earlier runs' for sets
    kept before they were pooled across the split) (`settings.pool_warmups`,
    `settings.pool_across`)."""
    if seeds < 1:
        raise ValueError(f"--twin-seeds must be at least 1, got {seeds}")
    if hindsight and as_whatif:
        raise ValueError("--hindsight and --whatif are two readings of a run: choose one")
    if hindsight_of and (hindsight or as_whatif):
        flag = "--hindsight" if hindsight else "--whatif"
        raise ValueError(
            f"--hindsight-of reads a prediction partly with hindsight: not with {flag}"
        )
    check_parts(hindsight_of)  # an unknown part is named before any run is read
    reading: Reading = "hindsight" if hindsight else "whatif" if as_whatif else "prediction"
    if out is not None and out.resolve() == kept.resolve():
        raise ValueError(
            "--out must be another folder: the kept one holds what live was first compared with"
        )
    settings_json, runs = _kept_runs(kept)
    block_size = int(settings_json["block_size"])
    pool_warmups_given = pool_warmups
    if pool_warmups is None:
        pool_warmups = reading == "prediction" and bool(settings_json.get("pool_warmups"))
    if pool_warmups and (hindsight or as_whatif):
        flag = "--hindsight" if hindsight else "--whatif"
        raise ValueError(f"--pool-warmups pools warm-ups for a prediction: not with {flag}")
    # As the kept validate pooled (sets kept before "pool_across" was, by configuration), or
    # as validate pools now when --pool-warmups says so.
    kept_across = str(settings_json.get("pool_across", "config"))
    pool_across = kept_across if pool_warmups_given is None else POOL_ACROSS[0]
    by_index: dict[int, list[Mapping[str, Any]]] = {}
    for number, entry in enumerate(runs):
        if on_status is not None:
            label = f"run {number + 1}/{len(runs)}, config {json.dumps(entry['change'])}"
            on_status(f"{label}: predicting the window with the twin", number)
        live = entry["live"]
        if rebuild_profile:  # the calibrations whose profiles this reading reads
            keys = ["calibration"] if reading == "prediction" else []
            if reading != "prediction" or hindsight_of:
                keys.append("calibration_after")
            live = {**live, **{key: _rebuilt(live[key], entry) for key in keys}}
        earlier = earlier_runs(runs, entry["index"], entry["run"], live["split"], pool_across)
        pooled = warmups_profile(live, earlier) if pool_warmups else None
        with tempfile.TemporaryDirectory(prefix="kvc-repredict-") as folder:
            entry["twin"] = predict(
                live,
                block_size,
                Path(folder),
                seeds=seeds,
                reading=reading,
                hindsight_of=hindsight_of,
                warmup_profile=pooled,
            )
        by_index.setdefault(entry["index"], []).append(entry)
    speeds = speeds_by_config(runs)
    configs = [
        config_entry(
            entries[0]["change"],
            [e["live"]["report"] for e in entries],
            [e["twin"] for e in entries],
            speeds.get(index, ()),
        )
        for index, entries in sorted(by_index.items())
    ]
    settings_json = {
        **settings_json,
        "twin_seeds": seeds,
        "repredicted_from": str(kept),
        "hindsight": hindsight,
        "hindsight_of": list(hindsight_of),
        "as_whatif": as_whatif,
        "rebuilt_profile": rebuild_profile,
        "pool_warmups": pool_warmups,
        "pool_across": pool_across,
    }
    result = _result(settings_json, configs)
    if out is not None:
        write_outputs(result, runs, out)
    return result


def earlier_runs(
    runs: Sequence[Mapping[str, Any]],
    index: int,
    run: int,
    split: Sequence[int],
    across: str,
) -> list[Any]:
    """The live runs among `runs` (validate's or kept entries) that ran before run `run` of
    config `index` (`run_order`: round by round) and whose warm-ups it pools: across
    "split", every one with its prefill:decode `split`, whatever its policy (the agents'
    steps and how they share the host do not depend on the policy, and a live Conductor
    keeps its calibration across a `PUT /v1/config`); across "config", its configuration's
    alone."""
    if across not in POOL_ACROSS:
        raise ValueError(f"pool across {across!r}: one of {', '.join(POOL_ACROSS)}")
    return [
        e["live"]
        for e in runs
        if (e["run"], e["index"]) < (run, index)
        and (
            tuple(e["live"]["split"]) == tuple(split) if across == "split" else e["index"] == index
        )
    ]


def warmups_profile(
    live: Mapping[str, Any], earlier: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """The profile of a live run's warm-up (as `run_live` returns the run) pooled with the
    warm-ups of the `earlier` runs (`earlier_runs`, `live_profile.pooled_inputs`): all a
    Conductor of that split could have measured by the end of this warm-up had it kept its
    calibration across the runs, less their windows (the same stretch of the trace as the
    one predicted). It keeps its own Conductor's beliefs and rest of the host.
    None without an earlier run, or for runs kept before their calibration's inputs were."""
    from backend.observe.live_profile import pooled_inputs, profile_of_inputs

    mine = live["calibration"].get("profile_inputs")
    theirs = [i for e in earlier if (i := e["calibration"].get("profile_inputs")) is not None]
    if mine is None or not theirs:
        return None
    speeds = host_speed.relative_speeds([i["window"].get("prefill", []) for i in [mine, *theirs]])
    own_speed = speeds[0]
    slower = [
        own_speed / speed if own_speed is not None and speed is not None else 1.0
        for speed in speeds[1:]
    ]
    return profile_of_inputs(pooled_inputs(mine, theirs, slower))


def _rebuilt(calibration: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    """`calibration` with its live profile built again from its kept inputs."""
    from backend.observe.live_profile import profile_of_inputs

    inputs = calibration.get("profile_inputs")
    if inputs is None:
        raise ValueError(
            f"run {entry['run'] + 1} of config {json.dumps(entry['change'])} kept no "
            "profile inputs (a validate before they were kept): its profile cannot be "
            "built again"
        )
    return {**calibration, "profile": profile_of_inputs(inputs)}


def _kept_runs(kept: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The settings and every live run (as `run_live` returned it) a validate --out kept."""
    try:
        settings_json = json.loads((kept / "result.json").read_text())["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(
            f"{kept}: no readable result.json with its settings (not a `twin validate "
            "--out` folder)"
        ) from None
    runs = []
    for config_dir in sorted(kept.glob("config-*"), key=lambda p: _number_in(p.name)):
        run_dirs = sorted(config_dir.glob("run-*"), key=lambda p: _number_in(p.name))
        for run, run_dir in enumerate(run_dirs or [config_dir]):
            try:
                live = json.loads((run_dir / "live-run.json").read_text())
                live["report"] = json.loads((run_dir / "live-report.json").read_text())
                live["trace"] = (run_dir / "window.jsonl").read_text()
                change = json.loads((run_dir / "change.json").read_text())
            except (OSError, ValueError) as error:
                raise ValueError(f"{run_dir}: not a kept live run ({error})") from None
            index = _number_in(config_dir.name)
            runs.append({"change": change, "index": index, "run": run, "live": live})
    if not runs:
        raise ValueError(f"{kept} holds no kept live run (config-N folders)")
    return settings_json, runs


def _number_in(name: str) -> int:
    return int(name.rpartition("-")[2]) if name.rpartition("-")[2].isdigit() else 0


def _result(settings_json: Mapping[str, Any], configs: list[dict[str, Any]]) -> dict[str, Any]:
    """The object `--json` prints: settings, each config's metrics, the rankings' tau, how
    often the twin moved a metric the way live did, and which bounds it held (`bounds`:
    this wave's acceptance and the goal, `check_bounds`)."""
    tau = {
        name: kendall_tau(
            [c["metrics"][name]["live"] for c in configs],
            [c["metrics"][name]["twin"] for c in configs],
        )
        for name in RANKED
    }
    return {
        "settings": dict(settings_json),
        "configs": configs,
        "kendall_tau": tau,
        "directions": directions(configs),
        "bounds": {
            bounds.name: check_bounds(configs, tau["ttft_mean_s"], bounds)
            for bounds in (WAVE_BOUNDS, GOAL_BOUNDS)
        },
    }


def write_outputs(
    result: Mapping[str, Any],
    raw: Sequence[Mapping[str, Any]],
    out: Path,
    *,
    work: Path | None = None,
) -> None:
    """result.json, the raw live and twin reports, validate.html (plotly), and from `work`
    each live run's database and logs (every request, decision and measurement)."""
    from backend.bench.validate_plots import validate_figure

    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    repeats = max((entry["run"] for entry in raw), default=0) + 1
    for entry in raw:  # config-I (one run each), or config-I/run-R with repeats
        folder = out / f"config-{entry['index']}"
        if repeats > 1:
            folder = folder / f"run-{entry['run']}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "change.json").write_text(json.dumps(entry["change"]) + "\n")
        (folder / "live-report.json").write_text(json.dumps(entry["live"]["report"], indent=1))
        (folder / "twin-report.json").write_text(json.dumps(entry["twin"], indent=1, default=str))
        (folder / "window.jsonl").write_text(entry["live"]["trace"])
        (folder / "live-profile.json").write_text(
            json.dumps(entry["live"]["calibration"]["profile"], indent=1)
        )
        # For reading; its inputs (every sample) are kept once, in live-run.json.
        after = {
            k: v for k, v in entry["live"]["calibration_after"].items() if k != "profile_inputs"
        }
        (folder / "calibration-after.json").write_text(json.dumps(after, indent=1))
        # Everything else the twin's prediction read, so a kept run can be predicted again.
        rest = {k: v for k, v in entry["live"].items() if k not in ("report", "trace")}
        (folder / "live-run.json").write_text(json.dumps(rest, indent=1))
        run_dir = (work or Path()) / f"config-{entry['index']}" / f"run-{entry['run']}"
        if work is not None and (run_dir / "data" / "kvcentric.db").exists():
            shutil.copyfile(run_dir / "data" / "kvcentric.db", folder / "live.db")
            shutil.copytree(run_dir / "logs", folder / "logs", dirs_exist_ok=True)
    first_runs = [entry for entry in raw if entry["run"] == 0]  # the CDFs: each config's first
    validate_figure(result, first_runs).write_html(out / "validate.html", include_plotlyjs="cdn")
