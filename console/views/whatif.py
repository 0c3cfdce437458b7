"""What-if page: replay a recorded window (or an uploaded Mooncake trace) through the twin
on the live cluster and on a proposed change, compare them, apply the change with the admin
token (the prediction goes into the audit log with it), and afterwards put the prediction
next to what the cluster measured since."""

import math
import time
from dataclasses import dataclass
from typing import Any

import streamlit as st

from backend.policy.config import PREFILL_SCHEDULERS, REJECTION_POLICIES
from backend.traces.loader import TRACE_BLOCK_SIZE, TraceRow
from console import format as fmt
from console import prediction as predictions
from console.connection import BackendError, client, settings, show_error
from console.settings import LIVE_TWIN_PROFILE
from console.whatif import (
    ProposedChange,
    TraceProblem,
    live_beliefs,
    live_profile_file,
    live_twin_config,
    policy_changes,
    proposed_config,
    role_switches,
    rows_from_jsonl,
    run_whatif,
)
from console.whatif_view import show_applied_prediction, show_result
from twin.config import TwinConfig

RESULT_KEY = "whatif_result"
WINDOWS_MIN = (5, 10, 15, 30, 60)
RECORDED, UPLOADED = "Recorded window", "Uploaded trace"


@dataclass(frozen=True, slots=True)
class Traffic:
    """What to replay: an upload, or the recorded window of `length_min` minutes that
    ended `ago_min` minutes ago."""

    upload: Any = None
    length_min: int = 10
    ago_min: float = 0.0


def load_traffic(
    traffic: Traffic, *, live_block_size: int
) -> tuple[list[TraceRow], dict[str, Any]]:
    """The trace rows to replay and what they are (kept in the prediction), with the block
    size their hash ids stand for: the Conductor's for a recorded window, the public
    traces' for an upload."""
    if traffic.upload is not None:
        name = traffic.upload.name
        rows = rows_from_jsonl(traffic.upload.getvalue(), name)
        return rows, {
            "source": "upload",
            "name": name,
            "num_rows": len(rows),
            "block_size": TRACE_BLOCK_SIZE,
        }
    end_s = time.time() - 60.0 * traffic.ago_min
    start_s = end_s - 60.0 * traffic.length_min
    text = client().export_trace(start_s=start_s, end_s=end_s, block_size=live_block_size)
    source = f"the recorded window {fmt.clock(start_s)} to {fmt.clock(end_s)}"
    rows = rows_from_jsonl(text.encode(), source, block_size=live_block_size)
    return rows, {
        "source": "recorded",
        "start_s": start_s,
        "end_s": end_s,
        "num_rows": len(rows),
        "block_size": live_block_size,
    }


def proposal_form(current: TwinConfig) -> ProposedChange | None:
    """The proposed change, once the operator submits the form."""
    total = current.num_prefill + current.num_decode
    with st.form("proposal"):
        st.markdown("**Proposed change** (starts from the live values)")
        left, middle, right = st.columns(3)
        is_infinite = math.isinf(current.threshold)
        threshold = left.number_input(
            "kvcache_balancing_threshold",
            min_value=1.0,
            value=2.0 if is_infinite else float(current.threshold),
            step=0.5,
            help="Fetch a remote prefix when it is at least this many times the local one.",
            key="whatif_threshold",
        )
        never_fetch = left.checkbox("∞: never fetch remote prefixes", value=is_infinite)
        scheduler = middle.selectbox(
            "Prefill scheduler",
            PREFILL_SCHEDULERS,
            index=PREFILL_SCHEDULERS.index(current.scheduler),
        )
        rejection = middle.selectbox(
            "Rejection policy",
            REJECTION_POLICIES,
            index=REJECTION_POLICIES.index(current.rejection),
        )
        decode_time_s = right.number_input(
            "t_d: uniform decode time (s)",
            min_value=0.1,
            value=float(current.decode_time_s),
            help="What early-predicted assumes every decoding request takes.",
        )
        num_prefill = right.number_input(
            f"Prefill agents (of {total}; the rest decode)",
            min_value=1,
            max_value=max(1, total - 1),
            value=current.num_prefill,
            step=1,
        )
        if not st.form_submit_button("Run what-if", type="primary"):
            return None
    return ProposedChange(
        threshold=float("inf") if never_fetch else float(threshold),
        scheduler=scheduler,
        rejection=rejection,
        decode_time_s=float(decode_time_s),
        num_prefill=int(num_prefill),
    )


def run(
    current: TwinConfig,
    change: ProposedChange,
    traffic: Traffic,
    *,
    agents: list[dict[str, Any]],
    config_version: int | None,
) -> None:
    """Simulate, and keep the result in the session for the result and Apply sections."""
    try:
        rows, trace = load_traffic(traffic, live_block_size=current.block_size)
        current = current.with_changes(block_size=trace["block_size"])
        candidate = proposed_config(current, change)
        beliefs = None
        if rows and trace["source"] == "recorded" and settings().twin_profile == LIVE_TWIN_PROFILE:
            # The twin then admits and refuses the window's requests by live's estimates.
            beliefs = live_beliefs(
                client().calibration(inputs=True),
                rows,
                window_start_s=trace["start_s"],
                speed=current.speed,
            )
        trace["believes"] = (
            "what the live Conductor believed, when it did"
            if beliefs is not None
            else "its own calibration of the replay"
        )
    except (BackendError, TraceProblem, ValueError) as error:
        st.error(f"cannot run the what-if: {error}")
        return
    if not rows:
        st.warning("That window holds no requests: nothing to simulate.")
        return
    bar = st.progress(0.0, text="starting the twin ...")
    try:
        result = run_whatif(
            current,
            candidate,
            rows,
            on_progress=lambda fraction, text: bar.progress(fraction, text=text),
            trace_label=trace.get("name", "recorded window"),
            ray_address=settings().ray_address,
            beliefs=beliefs,
        )
    except (ValueError, RuntimeError) as error:
        st.error(f"the twin could not run: {error}")
        return
    st.session_state[RESULT_KEY] = {
        "result": result,
        "trace": trace,
        "config_change": policy_changes(current, candidate),
        "role_switches": role_switches(agents, candidate.num_prefill),
        "config_version": config_version,
    }


def apply(whatif: dict[str, Any]) -> None:
    """Role switches first (each drains an agent), then the configuration with the
    prediction, which the backend writes into the audit log."""
    backend = client()
    if not backend.admin_token:
        st.error(
            "Applying a change needs the admin token: sign in with it in the sidebar. "
            "Nothing changed."
        )
        return
    summary = predictions.summarize(
        whatif["result"],
        config_change=whatif["config_change"],
        role_switches=whatif["role_switches"],
        trace=whatif["trace"],
        made_at_s=time.time(),
    )
    done = []
    try:
        for instance_id, role in whatif["role_switches"]:
            with st.spinner(f"draining {instance_id}, then switching it to {role} ..."):
                backend.switch_role(instance_id, role)
            done.append(f"{instance_id} -> {role}")
        view = backend.change_config(
            whatif["config_change"],
            prediction=summary,
            expected_version=whatif["config_version"],
        )
    except BackendError as error:
        switched = f" (already switched: {', '.join(done)})" if done else ""
        show_error(error, f"the change was not applied{switched}")
        return
    whatif["applied"] = (
        f"Applied as configuration version {view['version']}"
        + (f", agents switched: {', '.join(done)}" if done else "")
        + ". The prediction is in the audit log; compare it below as traffic comes in."
    )
    st.rerun()  # redraw without the Apply button, with the new configuration


st.title("What-if")
backend = client()
try:
    config_view = backend.config()
    agents = backend.agents()
    profile = settings().twin_profile
    if profile == LIVE_TWIN_PROFILE:  # what the Conductor fitted from its agents' measurements
        profile = live_profile_file(backend.calibration()["profile"])
    current = live_twin_config(config_view["config"], agents, profile=profile)
    profile_label = (
        "live (fitted from what the agents measured)"
        if settings().twin_profile == LIVE_TWIN_PROFILE
        else current.profile
    )
except BackendError as error:
    show_error(error, "cannot read the live cluster")
    st.stop()
except ValueError as error:
    st.error(f"cannot model the live cluster: {error}")
    st.stop()
st.caption(
    f"Live cluster: {current.num_prefill} prefill : {current.num_decode} decode agents, "
    f"{current.scheduler}, threshold {fmt.number(current.threshold)}, {current.rejection}, "
    f"t_d {fmt.seconds(current.decode_time_s)}, SLOs TTFT {fmt.seconds(current.ttft_slo_s)} / "
    f"TBT {fmt.seconds(current.tbt_slo_s)}; configuration version {config_view['version']}; "
    f"twin profile {profile_label}"
)
source = st.radio("Traffic to replay", (RECORDED, UPLOADED), horizontal=True, key="whatif_source")
if source == RECORDED:
    length, ago, _ = st.columns([2, 2, 3])
    traffic = Traffic(
        length_min=length.selectbox(
            "Recorded window (exported from the backend)",
            WINDOWS_MIN,
            index=1,
            format_func=lambda minutes: f"{minutes} min",
            key="whatif_window",
        ),
        ago_min=ago.number_input(
            "ending this many minutes ago", min_value=0.0, value=0.0, key="whatif_ago"
        ),
    )
else:
    upload = st.file_uploader(
        "Mooncake JSONL trace (timestamp, input_length, output_length, hash_ids)",
        type=["jsonl", "json", "txt"],
        key="whatif_upload",
    )
    traffic = Traffic(upload=upload)
change = proposal_form(current)
if change is not None and source == UPLOADED and traffic.upload is None:
    st.error("cannot run the what-if: choose a Mooncake JSONL file to upload first")
elif change is not None:
    run(current, change, traffic, agents=agents, config_version=config_view["version"])
whatif = st.session_state.get(RESULT_KEY)
if whatif is not None:
    show_result(whatif)
    st.subheader("Apply")
    if not whatif["config_change"] and not whatif["role_switches"]:
        st.info("The proposal is the live configuration: there is nothing to apply.")
    elif "applied" not in whatif and st.button(
        "Apply the proposed change", type="primary", key="whatif_apply"
    ):
        apply(whatif)
    if "applied" in whatif:  # once per what-if: a new run is needed to apply again
        st.success(whatif["applied"])
show_applied_prediction()
