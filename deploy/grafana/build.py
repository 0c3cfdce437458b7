"""Writes the Grafana dashboards of this folder (kvcentric-*.json) from the panels below.

    python deploy/grafana/build.py          # rewrite the JSON files
    python deploy/grafana/build.py --check  # exit 1 if a JSON file differs from its panels

The panels are written here rather than by hand in JSON so that each is a few readable lines
(title, PromQL, unit) and the layout is computed. Every metric a query names is exported by
a Conductor (`/metrics` on its REST port) or an agent (`--metrics-listen`); a test scrapes
both and checks (tests/deploy/test_grafana.py). Import the JSON into Grafana (Dashboards ->
Import) and pick the Prometheus data source that scrapes them.
"""

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).parent
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH, HEIGHT = 12, 8  # two panels a row on Grafana's 24-column grid


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    unit: str = "short"
    thresholds: tuple[float, ...] = ()  # red lines, e.g. 1.0 for a load at its SLO
    kind: str = "timeseries"


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[tuple[str, tuple[Panel, ...]], ...] = field(default=())


def _rate(metric: str, window: str = "1m") -> str:
    return f"rate({metric}[{window}])"


def _quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by (le) ({_rate(histogram + '_bucket')}))"


def _amplitude(role: str) -> str:
    """The project's oscillation amplitude (p95 - p5 of the pool's mean load) over 10 min."""
    series = f'avg(kvcentric_instance_load{{role="{role}"}})'
    return (
        f"quantile_over_time(0.95, {series}[10m:5s]) - quantile_over_time(0.05, {series}[10m:5s])"
    )


OVERVIEW = Dashboard(
    uid="kvcentric-overview",
    title="kvcentric: cluster",
    description="The Conductor's view: pool loads, latency against the SLOs, admission, the "
    "KV cache and the calibration of its cost model.",
    rows=(
        (
            "Pools",
            (
                Panel(
                    "Pool load",
                    "Mean load of each pool as the policy sees it (1.0: at the SLO or KV "
                    "memory full). Prefill: queue time over the TTFT SLO; decode: max(predicted "
                    "TBT over its SLO, KV memory share). Prefill and decode moving in anti-phase "
                    "is the oscillation early rejection can cause.",
                    (("avg by (role) (kvcentric_instance_load)", "{{role}}"),),
                    thresholds=(1.0,),
                ),
                Panel(
                    "Load oscillation amplitude (10 min)",
                    "p95 - p5 of each pool's mean load over the last 10 minutes, the amplitude "
                    "the twin and the console report (its period, the first autocorrelation "
                    "peak, is on the console's Live page: PromQL cannot compute it).",
                    ((_amplitude("prefill"), "prefill"), (_amplitude("decode"), "decode")),
                ),
                Panel(
                    "Load per instance",
                    "Each joined instance's load.",
                    (("kvcentric_instance_load", "{{role}} {{instance_id}}"),),
                    thresholds=(1.0,),
                ),
                Panel(
                    "Decode batches",
                    "Requests in each decode instance's batch.",
                    (
                        (
                            'kvcentric_instance_decode_batch_size{role="decode"}',
                            "{{instance_id}}",
                        ),
                    ),
                ),
            ),
        ),
        (
            "Latency against the SLOs",
            (
                Panel(
                    "TTFT",
                    "Time to first token (arrival to the first token leaving the Conductor), "
                    "percentiles over 1 minute, and the SLO in force.",
                    (
                        (_quantile(0.5, "kvcentric_ttft_seconds"), "p50"),
                        (_quantile(0.9, "kvcentric_ttft_seconds"), "p90"),
                        (_quantile(0.99, "kvcentric_ttft_seconds"), "p99"),
                        ('kvcentric_slo_seconds{kind="ttft"}', "SLO"),
                    ),
                    unit="s",
                ),
                Panel(
                    "TBT",
                    "Time between tokens, every gap of every stream, percentiles over 1 "
                    "minute, and the SLO in force.",
                    (
                        (_quantile(0.5, "kvcentric_tbt_seconds"), "p50"),
                        (_quantile(0.9, "kvcentric_tbt_seconds"), "p90"),
                        (_quantile(0.99, "kvcentric_tbt_seconds"), "p99"),
                        ('kvcentric_slo_seconds{kind="tbt"}', "SLO"),
                    ),
                    unit="s",
                ),
            ),
        ),
        (
            "Admission",
            (
                Panel(
                    "Rejections by stage and reason",
                    "admission: refused before any work (429); decode: refused on arrival at "
                    "the decode instance, its prefill wasted.",
                    (
                        (
                            f"sum by (stage, reason) ({_rate('kvcentric_rejections_total')})",
                            "{{stage}}:{{reason}}",
                        ),
                    ),
                    unit="reqps",
                ),
                Panel(
                    "Requests",
                    "Submitted, accepted, and ended by terminal state.",
                    (
                        (f"sum({_rate('kvcentric_requests_submitted_total')})", "submitted"),
                        (f"sum({_rate('kvcentric_requests_accepted_total')})", "accepted"),
                        (
                            f"sum by (state) ({_rate('kvcentric_requests_terminal_total')})",
                            "{{state}}",
                        ),
                    ),
                    unit="reqps",
                ),
            ),
        ),
        (
            "KV cache",
            (
                Panel(
                    "Hit ratio: achieved and reachable",
                    "Prompt tokens reused over prompt tokens dispatched (5 min), and the "
                    "ratio the pool could have reached: the longest prefix any prefill "
                    "instance held at decision time.",
                    (
                        (
                            f"{_rate('kvcentric_reused_tokens_total', '5m')} / "
                            f"{_rate('kvcentric_input_tokens_total', '5m')}",
                            "achieved",
                        ),
                        (
                            f"{_rate('kvcentric_reachable_tokens_total', '5m')} / "
                            f"{_rate('kvcentric_input_tokens_total', '5m')}",
                            "reachable",
                        ),
                    ),
                    unit="percentunit",
                ),
                Panel(
                    "Transfers and replications",
                    "Prefix tokens fetched from another instance, blocks copied to replicate "
                    "hot prefixes, and prefill decisions by branch.",
                    (
                        (_rate("kvcentric_transferred_tokens_total"), "tokens transferred/s"),
                        (_rate("kvcentric_replicated_blocks_total"), "blocks replicated/s"),
                        (
                            f"sum by (branch) ({_rate('kvcentric_decisions_total')})",
                            "decisions/s {{branch}}",
                        ),
                    ),
                ),
            ),
        ),
        (
            "Agents and calibration",
            (
                Panel(
                    "Heartbeat age",
                    "Seconds since each agent's last heartbeat; an agent silent past the "
                    "Conductor's timeout is taken out.",
                    (("kvcentric_instance_heartbeat_age_seconds", "{{role}} {{instance_id}}"),),
                    unit="s",
                ),
                Panel(
                    "Cost model: median relative error",
                    "Median |believed - measured| / measured of prefills and decode steps over "
                    "the calibration window, after each refit; and the number of refits.",
                    (
                        ("kvcentric_calibration_median_rel_error", "{{kind}}"),
                        ("kvcentric_calibration_refits", "refits"),
                    ),
                ),
                Panel(
                    "KV link bandwidth",
                    "Bandwidth the policy believes from each source instance to each prefill "
                    "instance, measured from their fetches; the transfer branch of routing "
                    "uses it, so a slow link is fetched from less.",
                    (
                        (
                            "kvcentric_link_bandwidth_bytes_per_second",
                            "{{source}} -> {{destination}}",
                        ),
                    ),
                    unit="Bps",
                ),
            ),
        ),
    ),
)

AGENTS = Dashboard(
    uid="kvcentric-agents",
    title="kvcentric: agents",
    description="Each agent's own metrics (scraped from its --metrics-listen address; "
    "counters are told apart by the scrape's instance label, gauges also by instance_id).",
    rows=(
        (
            "Work",
            (
                Panel(
                    "Prefill queue",
                    "Prefills waiting and running on each prefill agent.",
                    (
                        ("kvcentric_agent_prefill_queue_length", "waiting {{instance_id}}"),
                        ("kvcentric_agent_prefill_running", "running {{instance_id}}"),
                    ),
                ),
                Panel(
                    "Prefill time",
                    "Mean seconds per prefill (queue included) over 1 minute.",
                    (
                        (
                            f"{_rate('kvcentric_agent_prefill_seconds_sum')} / "
                            f"{_rate('kvcentric_agent_prefill_seconds_count')}",
                            "{{instance}}",
                        ),
                    ),
                    unit="s",
                ),
                Panel(
                    "Decode step",
                    "The last decode step's time and the batch it ran.",
                    (
                        ("kvcentric_agent_decode_last_step_seconds", "step {{instance_id}}"),
                        ("kvcentric_agent_decode_batch_size", "batch {{instance_id}}"),
                    ),
                ),
                Panel(
                    "Tokens decoded",
                    "Tokens per second each decode agent generates.",
                    ((_rate("kvcentric_agent_decode_tokens_total"), "{{instance}}"),),
                ),
            ),
        ),
        (
            "KV pool and data plane",
            (
                Panel(
                    "Pool bytes by tier",
                    "Bytes held in each agent's shard of the pool, DRAM and SSD.",
                    (("kvcentric_agent_pool_bytes", "{{instance_id}} {{tier}}"),),
                    unit="bytes",
                ),
                Panel(
                    "Pool churn",
                    "Blocks stored, evicted and refused per second.",
                    tuple(
                        (
                            _rate(f"kvcentric_agent_pool_{what}_blocks_total"),
                            f"{what} {{{{instance_id}}}}",
                        )
                        for what in ("stored", "evicted", "refused")
                    ),
                ),
                Panel(
                    "Data plane",
                    "KV bytes per second moved between agents, by direction.",
                    (
                        (
                            _rate("kvcentric_agent_transport_bytes_total"),
                            "{{instance}} {{direction}}",
                        ),
                    ),
                    unit="Bps",
                ),
                Panel(
                    "Pending KV hand-offs",
                    "Hand-offs a decode agent has received and not yet started decoding.",
                    (("kvcentric_agent_pending_handoffs", "{{instance_id}}"),),
                ),
            ),
        ),
    ),
)

DASHBOARDS = (OVERVIEW, AGENTS)


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict:
    steps = [{"color": "green", "value": None}]
    steps += [{"color": "red", "value": value} for value in panel.thresholds]
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": HEIGHT, "w": WIDTH, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {
                "unit": panel.unit,
                "thresholds": {"mode": "absolute", "steps": steps},
                "custom": {"thresholdsStyle": {"mode": "line" if panel.thresholds else "off"}},
            },
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + n), "datasource": DATASOURCE, "expr": e, "legendFormat": lg}
            for n, (e, lg) in enumerate(panel.queries)
        ],
    }


def dashboard_json(dashboard: Dashboard) -> dict:
    """The Grafana JSON model of `dashboard`: a collapsed-free row per group, two panels wide."""
    panels: list[dict] = []
    y = 0
    for row_title, row_panels in dashboard.rows:
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        for n, panel in enumerate(row_panels):
            x = (n % 2) * WIDTH
            panels.append(_panel_json(panel, len(panels) + 1, x, y))
            if n % 2 == 1 or n == len(row_panels) - 1:
                y += HEIGHT
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["kvcentric"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                }
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def rendered() -> dict[Path, str]:
    """Each dashboard's file and its JSON text."""
    return {
        HERE / f"{d.uid}.json": json.dumps(dashboard_json(d), indent=2) + "\n" for d in DASHBOARDS
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python deploy/grafana/build.py",
        description="Write the Grafana dashboards (deploy/grafana/*.json) from their "
        "definitions in this file.",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; fail if a JSON file is out of date"
    )
    args = parser.parse_args(argv)
    stale = [path for path, text in rendered().items() if not _same(path, text)]
    if args.check:
        for path in stale:
            print(f"{path} is out of date: run python deploy/grafana/build.py", file=sys.stderr)
        return 1 if stale else 0
    for path, text in rendered().items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


def _same(path: Path, text: str) -> bool:
    return path.is_file() and path.read_text(encoding="utf-8") == text


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
