"""`kvcentric chaos`: replay a trace while agents and the Conductor die, then check the record.

It starts a stack of its own (`children.start_local_stack`: a Conductor on SQLite and `tiny`
agents, 2P+2D by default) under the same supervision as `kvcentric up` (a child that dies is
started again: an agent under its instance id, the Conductor on its database), replays a
window of the trace against it with `kvcentric replay`, and carries out a schedule of faults
measured from the replay's start:

- `kill`: SIGKILL of the Conductor or an agent (no goodbye of any kind);
- `term`: SIGTERM of an agent (it drains, says goodbye, exits);
- `flood`: silent TCP connections to an agent's data port, held for a while.

Meanwhile it watches `GET /v1/agents` (every 0.25 s) and `/healthz`. Afterwards it reads the
Conductor's database and the replay's results and checks that nothing was lost:

- every request the Conductor accepted (the client got its id) is in the database with
  exactly one terminal state, and no request there is left open;
- no request id came back twice;
- no agent left the cluster that was not killed or stopped (a healthy agent expelled: for
  example a prefill agent thrown out for a decode agent's failure, or for a flood).

Requests sent while the Conductor was down are refused at connection (no id) and counted
apart: nothing was accepted, so nothing was lost. The figures (what was killed when, how long
until the Conductor noticed and until the child was back, outcomes by state and reason) go
to docs/reliability.md.
"""

import json
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from backend.cli.children import (
    KVCENTRIC,
    Child,
    LocalStack,
    SupervisingThread,
    Supervisor,
    get_json,
    start_local_stack,
)
from backend.traces import SHIPPED_TRACE

FaultKind = Literal["kill", "term", "flood"]
FAULT_KINDS: tuple[str, ...] = ("kill", "term", "flood")
WATCH_INTERVAL_S = 0.25
# A departure this long after a fault on that agent is the fault's; any other is an expulsion.
DETECTION_WINDOW_S = 30.0


@dataclass(frozen=True, slots=True)
class Fault:
    at_s: float  # seconds after the replay's start
    kind: FaultKind
    target: str  # "conductor" or an agent's instance id


def parse_schedule(text: str) -> tuple[Fault, ...]:
    """`"10:kill:prefill-1,25:flood:prefill-0"` -> faults; ValueError naming a bad item."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        parts = item.split(":")
        if len(parts) != 3:
            raise ValueError(f"fault {item!r}: write SECONDS:KIND:TARGET, e.g. 10:kill:prefill-1")
        at, kind, target = parts
        try:
            at_s = float(at)
        except ValueError:
            raise ValueError(f"fault {item!r}: {at!r} is not a number of seconds") from None
        if not at_s >= 0:
            raise ValueError(f"fault {item!r}: the time must be >= 0 s")
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault {item!r}: kind must be one of {', '.join(FAULT_KINDS)}")
        if kind != "kill" and target == "conductor":
            raise ValueError(f"fault {item!r}: only kill applies to the conductor")
        faults.append(Fault(at_s, kind, target))  # type: ignore[arg-type]
    if not faults:
        raise ValueError("the schedule holds no fault")
    return tuple(sorted(faults, key=lambda fault: fault.at_s))


DEFAULT_SCHEDULE = (
    "10:kill:prefill-1,25:flood:prefill-0,35:kill:decode-0,50:kill:conductor,70:term:prefill-0"
)


@dataclass(frozen=True, slots=True)
class ChaosSettings:
    trace: Path = SHIPPED_TRACE
    minutes: str = "0:1.5"
    speed: float = 1.0
    length_scale: float = 1 / 32  # kvcentric up's: one 512-token trace block, one serving block
    block_size: int = 16
    num_prefill: int = 2
    num_decode: int = 2
    profile: str = "tiny-cpu"
    schedule: tuple[Fault, ...] = parse_schedule(DEFAULT_SCHEDULE)
    ttft_slo_s: float | None = None  # None: the Conductor's default
    tbt_slo_s: float | None = None
    settle_s: float = 10.0  # after the replay, before the record is read
    flood_connections: int = 300
    flood_s: float = 5.0

    def check_targets(self) -> None:
        """ValueError naming a fault whose target is not in the stack."""
        names = {"conductor"} | {f"prefill-{i}" for i in range(self.num_prefill)}
        names |= {f"decode-{i}" for i in range(self.num_decode)}
        for fault in self.schedule:
            if fault.target not in names:
                raise ValueError(
                    f"fault {fault.at_s:g}:{fault.kind}:{fault.target}: no such target; the "
                    f"stack has {', '.join(sorted(names))}"
                )


# The agents joined at one time, each as (instance id, control address): an agent started
# again keeps its id but listens on a new port, so the pair tells its lives apart. None: the
# Conductor did not answer.
Joined = frozenset[tuple[str, str]] | None


@dataclass
class _Watch:
    """What GET /v1/agents said over time."""

    seen: list[tuple[float, Joined]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, stack: LocalStack) -> None:
        while not self.stop.wait(WATCH_INTERVAL_S):
            agents = get_json(f"{stack.base_url}/v1/agents", stack.api_key)
            joined = (
                frozenset((a["instance_id"], a["rpc_address"]) for a in agents)
                if isinstance(agents, list)
                else None
            )
            self.seen.append((time.time(), joined))


def run_chaos(
    settings: ChaosSettings, work_dir: Path, on_status: Callable[[str], None]
) -> dict[str, Any]:
    """Start the stack, replay with the faults, stop it; the checked record."""
    settings.check_targets()
    on_status(f"starting a conductor and {settings.num_prefill}P+{settings.num_decode}D agents")
    stack = start_local_stack(
        work_dir,
        num_prefill=settings.num_prefill,
        num_decode=settings.num_decode,
        block_size=settings.block_size,
        profile=settings.profile,
        env={
            "KVC_HEARTBEAT_INTERVAL_S": "0.5",
            **({"KVC_TTFT_SLO_S": str(settings.ttft_slo_s)} if settings.ttft_slo_s else {}),
            **({"KVC_TBT_SLO_S": str(settings.tbt_slo_s)} if settings.tbt_slo_s else {}),
        },
    )
    events: list[tuple[float, str]] = []
    supervising = SupervisingThread(
        Supervisor(stack.children, report=lambda m: events.append((time.time(), m))),
        interval_s=0.2,
    )
    watch = _Watch()
    watcher = threading.Thread(target=watch.run, args=(stack,), name="chaos-watch", daemon=True)
    watcher.start()
    done: list[dict[str, Any]] = []
    replay: Child | None = None
    try:
        replay = _start_replay(settings, stack, work_dir / "replay")
        started_s = time.time()
        on_status(f"replaying minutes {settings.minutes}; {len(settings.schedule)} faults due")
        faults = threading.Thread(
            target=_carry_out,
            args=(settings, stack, started_s, done, on_status),
            name="chaos-faults",
            daemon=True,
        )
        faults.start()
        while replay.process.poll() is None:
            supervising.check()
            time.sleep(0.5)
        replay.wait()
        faults.join()
        on_status(f"replay over; {settings.settle_s:g} s for the last requests to end")
        time.sleep(settings.settle_s)
        supervising.check()
    finally:
        supervising.stop()
        watch.stop.set()
        watcher.join(5)
        stack.stop(replay)
    results = [
        json.loads(line)
        for line in (work_dir / "replay.jsonl").read_text().splitlines()
        if line.strip()
    ]
    return check_record(
        results, _database_rows(stack), done, watch.seen, events, _left_reasons(stack)
    )


def _start_replay(settings: ChaosSettings, stack: LocalStack, out: Path) -> Child:
    args = [
        KVCENTRIC, "replay", "--url", stack.base_url, "--trace", str(settings.trace),
        "--minutes", settings.minutes, "--length-scale", str(settings.length_scale),
        "--speed", str(settings.speed), "--out", str(out.with_suffix(".jsonl")),
    ]  # fmt: skip
    return Child("replay", args, stack.env, out.with_suffix(".log"), stdout_pipe=False)


def _carry_out(
    settings: ChaosSettings,
    stack: LocalStack,
    started_s: float,
    done: list[dict[str, Any]],
    on_status: Callable[[str], None],
) -> None:
    for fault in settings.schedule:
        delay_s = started_s + fault.at_s - time.time()
        if delay_s > 0:
            time.sleep(delay_s)
        child = stack.conductor if fault.target == "conductor" else stack.agent(fault.target)
        at_s = time.time()
        on_status(f"t={at_s - started_s:5.1f} s: {fault.kind} {fault.target}")
        if fault.kind == "flood":
            _flood(stack, fault.target, settings.flood_connections, settings.flood_s)
        elif child.process.poll() is None:
            os.kill(child.process.pid, signal.SIGKILL if fault.kind == "kill" else signal.SIGTERM)
        done.append({**asdict(fault), "time_s": at_s, "replay_s": at_s - started_s})


def _flood(stack: LocalStack, instance_id: str, connections: int, hold_s: float) -> None:
    """`connections` TCP connections to the agent's data port that never authenticate."""
    agents = get_json(f"{stack.base_url}/v1/agents", stack.api_key) or []
    address = next(
        (a["data_address"] for a in agents if a["instance_id"] == instance_id),  # type: ignore[union-attr]
        None,
    )
    if address is None:
        return  # not joined now: nothing to flood
    host, port = address.rsplit(":", 1)
    sockets = []
    try:
        for _ in range(connections):
            try:
                sockets.append(socket.create_connection((host, int(port)), timeout=1))
            except OSError:
                break  # the port refuses more: the flood is on
        time.sleep(hold_s)
    finally:
        for sock in sockets:
            sock.close()


def _database_rows(stack: LocalStack) -> list[dict[str, Any]]:
    """Every request the Conductor recorded: id, outcome state and reason."""
    from backend.db.request_log import list_requests
    from backend.db.session import create_db_engine, create_session_factory

    engine = create_db_engine(f"sqlite:///{stack.database.as_posix()}")
    try:
        with create_session_factory(engine)() as session:
            records = list_requests(session=session, start_s=0.0, end_s=float("inf"))
    finally:
        engine.dispose()
    return [
        {
            "id": r.request_id,
            "state": r.outcome.state if r.outcome is not None else None,
            "reason": r.outcome.reason if r.outcome is not None else None,
        }
        for r in records
    ]


def _left_reasons(stack: LocalStack) -> list[str]:
    """The Conductor's lines "agent X left: why" (over all its lives)."""
    text = (stack.logs / "conductor.log").read_text(errors="replace")
    return [line.split("agent ", 1)[1] for line in text.splitlines() if " left: " in line]


def check_record(
    results: Sequence[dict[str, Any]],
    rows: Sequence[dict[str, Any]],
    faults: Sequence[dict[str, Any]],
    seen: Sequence[tuple[float, Joined]],
    events: Sequence[tuple[float, str]],
    left_reasons: Sequence[str],
) -> dict[str, Any]:
    """The replay's results against the database and the agents watched over time."""
    ids = [r["id"] for r in results if r.get("id")]
    duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)
    by_id = {row["id"]: row for row in rows}
    lost = sorted(i for i in set(ids) if i not in by_id)
    still_open = sorted(row["id"] for row in rows if row["state"] is None)
    never_accepted = Counter(
        (r.get("message") or r.get("status") or "?")[:60] for r in results if not r.get("id")
    )
    outcomes = Counter(f"{row['state']}:{row['reason'] or '-'}" for row in rows if row["state"])
    departures = _departures(seen)
    expelled, fault_rows = _explain(departures, faults, seen)
    return {
        "num_sent": len(results),
        "num_accepted": len(set(ids)),
        "num_never_accepted": sum(never_accepted.values()),
        "never_accepted": dict(never_accepted.most_common()),
        "outcomes": dict(sorted(outcomes.items())),
        "num_lost": len(lost),
        "lost": lost[:20],
        "num_open": len(still_open),
        "open": still_open[:20],
        "num_duplicates": len(duplicates),
        "duplicates": duplicates[:20],
        "num_expelled": len(expelled),
        "expelled": expelled,
        "faults": fault_rows,
        "left_reasons": list(left_reasons),
        "supervisor": [message for _, message in events],
        "ok": not (lost or still_open or duplicates or expelled),
    }


def _departures(seen: Sequence[tuple[float, Joined]]) -> list[tuple[float, str]]:
    """(time, instance id) whenever a watched agent's life ends while the Conductor answers
    (it is gone, or back on another address); a Conductor that was down and comes back
    starts the watch afresh."""
    departures = []
    previous: Joined = None
    for time_s, joined in seen:
        if joined is None:
            previous = None
            continue
        if previous is not None:
            departures += [(time_s, gone) for gone, _ in sorted(previous - joined)]
        previous = joined
    return departures


def _explain(
    departures: Sequence[tuple[float, str]],
    faults: Sequence[dict[str, Any]],
    seen: Sequence[tuple[float, Joined]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Departures no kill or stop explains (healthy agents expelled), and per fault: how long
    until the Conductor noticed it and until the target served again (a new life of the
    agent joined; the Conductor answered again)."""
    explained: set[int] = set()
    rows = []
    for fault in faults:
        at_s, target = fault["time_s"], fault["target"]
        row = {k: fault[k] for k in ("replay_s", "kind", "target")}
        row["detected_after_s"] = row["back_after_s"] = None
        if target == "conductor":
            down = [t for t, joined in seen if t > at_s and joined is None]
            back = [t for t, joined in seen if down and t > down[0] and joined]
            row["back_after_s"] = back[0] - at_s if back else None
        elif fault["kind"] in ("kill", "term"):
            index = next(
                (
                    i
                    for i, (t, who) in enumerate(departures)
                    if who == target and at_s <= t <= at_s + DETECTION_WINDOW_S
                ),
                None,
            )
            if index is not None:
                explained.add(index)
                row["detected_after_s"] = departures[index][0] - at_s
            before = _lives(seen, at_s, target)
            again = [
                t
                for t, joined in seen
                if t > at_s and joined and _lives_in(joined, target) - before
            ]
            row["back_after_s"] = again[0] - at_s if again else None
        rows.append(row)
    expelled = [
        {"time_s": t, "instance_id": who}
        for i, (t, who) in enumerate(departures)
        if i not in explained
    ]
    return expelled, rows


def _lives_in(joined: frozenset[tuple[str, str]], instance_id: str) -> set[str]:
    return {address for who, address in joined if who == instance_id}


def _lives(seen: Sequence[tuple[float, Joined]], until_s: float, instance_id: str) -> set[str]:
    """The addresses `instance_id` had joined with until `until_s`."""
    return set().union(
        *(_lives_in(joined, instance_id) for t, joined in seen if t <= until_s and joined)
    )


def render_table(record: dict[str, Any]) -> str:
    """The record as the lines `kvcentric chaos` prints."""

    def seconds(value: float | None) -> str:
        return f"{value:.1f} s" if value is not None else "-"

    lines = ["fault                          at       noticed    serving again"]
    for row in record["faults"]:
        what = f"{row['kind']} {row['target']}"
        lines.append(
            f"{what:<30} {row['replay_s']:5.1f} s  {seconds(row['detected_after_s']):>9}"
            f"  {seconds(row['back_after_s']):>9}"
        )
    lines += [
        "",
        f"requests sent {record['num_sent']}, accepted {record['num_accepted']}, "
        f"refused before acceptance {record['num_never_accepted']}",
    ]
    lines += [f"  {key}: {count}" for key, count in record["outcomes"].items()]
    verdicts = (
        ("lost (accepted, not recorded)", record["num_lost"]),
        ("open (no terminal state)", record["num_open"]),
        ("duplicate ids", record["num_duplicates"]),
        ("healthy agents expelled", record["num_expelled"]),
    )
    lines += ["", *(f"{label}: {count}" for label, count in verdicts)]
    lines.append("OK: nothing lost" if record["ok"] else "FAILED: see above")
    return "\n".join(lines)
