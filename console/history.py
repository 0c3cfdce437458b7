"""The audit log as text: what each entry changed (old -> new, per setting or agent role)
and the headline of the prediction it came with, for the Audit page's table."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from console import format as fmt
from console import prediction as predictions
from console.whatif import LIVE_PROFILE_PREFIX


def describe_change(old: Any, new: Any) -> str:
    """'name: old -> new' for each key that differs; a whole value when not a mapping."""
    if isinstance(new, Mapping) and "instance_id" in new and "role" in new:
        old_role = old.get("role") if isinstance(old, Mapping) else None
        return f"{new['instance_id']}: {old_role} -> {new['role']}"
    if isinstance(new, Mapping) and (old is None or isinstance(old, Mapping)):
        if old is None:
            return "initial: " + ", ".join(f"{k}={_value(v)}" for k, v in sorted(new.items()))
        changed = [
            f"{key}: {_value(old.get(key))} -> {_value(new.get(key))}"
            for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key)
        ]
        return "; ".join(changed) if changed else "no setting changed"
    return f"{_value(old)} -> {_value(new)}"


def describe_prediction(prediction: Mapping[str, Any] | None) -> str:
    """The headline predicted deltas of a console prediction; other predictions by keys."""
    if not prediction:
        return ""
    if not predictions.is_console_prediction(prediction):
        return ", ".join(f"{k}={_value(v)}" for k, v in sorted(prediction.items()))
    deltas = {row["metric"]: row for row in prediction["deltas"]}
    parts = []
    for name in predictions.HEADLINE:
        row = deltas.get(name)
        if row is not None:
            before, after = (fmt.metric(name, row[role]) for role in ("baseline", "candidate"))
            parts.append(f"{name} {before} -> {after}")
    return "; ".join(parts)


def prediction_caption(prediction: Mapping[str, Any]) -> str:
    """What a console prediction simulated: its traffic, profile, split and change."""
    trace = prediction.get("trace", {})
    if trace.get("name"):
        source = f"the trace {trace['name']}"
    elif trace.get("start_s") is not None and trace.get("end_s") is not None:
        source = f"the recorded window {fmt.clock(trace['start_s'])} to {fmt.clock(trace['end_s'])}"
    else:
        source = "a recorded window"
    split = prediction.get("split", {})
    before, after = split.get("baseline"), split.get("candidate")
    split_text = f"P:D {before}" + (" (unchanged)" if before == after else f" -> {after}")
    change = ", ".join(f"{k}={_value(v)}" for k, v in prediction.get("config_change", {}).items())
    profile = str(prediction.get("profile"))
    if Path(profile).name.startswith(LIVE_PROFILE_PREFIX):  # the what-if's copy, not a name
        profile = "live (fitted from the agents' measurements)"
    return (
        f"Twin run on {source} ({fmt.count(trace.get('num_rows'))} requests), profile "
        f"{profile}; {split_text}; change: {change or 'none'}"
    )


def prediction_rows(prediction: Mapping[str, Any]) -> list[dict[str, str]]:
    """The predicted metric deltas of a console prediction, formatted by unit."""
    return [
        {
            "metric": row["metric"],
            "current": fmt.metric(row["metric"], row["baseline"]),
            "proposed": fmt.metric(row["metric"], row["candidate"]),
            "delta": fmt.metric(row["metric"], row["delta"]),
            "verdict": row["verdict"] or "",
        }
        for row in prediction.get("deltas", [])
    ]


def _value(value: Any) -> str:
    return fmt.number(value) if isinstance(value, float) else str(value)


def audit_rows(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "time": fmt.clock(entry["time_s"]),
            "who": entry["actor"],
            "action": entry["action"],
            "version": entry["config_version"],
            "what": describe_change(entry["old_value"], entry["new_value"]),
            "prediction": describe_prediction(entry["prediction"]),
        }
        for entry in entries
    ]
