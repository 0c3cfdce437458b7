"""Agents page: each agent's role, state, health, queue, batch and memory (GET /v1/agents),
refreshed in place, and switching an agent's role (the backend drains it first) after an
explicit confirmation, with the admin token."""

from typing import Any

import streamlit as st

from console import format as fmt
from console.charts import calibration_figure
from console.connection import BackendError, client, settings, show_error
from console.widgets import chart, table

# Agents beat every second; one unheard of for longer than this is shown as late.
LATE_AFTER_S = 3.0
PENDING_KEY = "pending_role_switch"
ROLES = ("prefill", "decode")


def health(agent: dict[str, Any]) -> str:
    age_s = agent["seconds_since_heartbeat"]
    return "ok" if age_s <= LATE_AFTER_S else f"late ({age_s:.0f} s)"


def agent_row(agent: dict[str, Any]) -> dict[str, Any]:
    load = agent["load"]
    return {
        "agent": agent["instance_id"],
        "role": agent["role"],
        "state": agent.get("state", "active"),
        "health": health(agent),
        "queued": load.get("num_queued", 0),
        "running": load.get("num_running", 0),
        "batch": load.get("batch_size", 0),
        "DRAM": f"{fmt.data_size(load.get('dram_bytes'))} of "
        f"{fmt.data_size(load.get('dram_capacity_bytes'))}",
        "KV blocks": load.get("num_dram_blocks", 0) + load.get("num_ssd_blocks", 0),
        "predicted TBT": fmt.seconds(load.get("predicted_tbt_s")),
        "queued tokens": load.get("queued_tokens", 0),
        "context tokens": load.get("context_tokens", 0),
        "preset": agent["preset"],
        "address": agent["rpc_address"],
    }


def agents_panel() -> None:
    try:
        agents = client().agents()
    except BackendError as error:
        show_error(error, "cannot list the agents")
        return
    by_role = {role: sum(agent["role"] == role for agent in agents) for role in ROLES}
    columns = st.columns(4)
    columns[0].metric("Agents", fmt.count(len(agents)))
    columns[1].metric("Prefill", fmt.count(by_role["prefill"]))
    columns[2].metric("Decode", fmt.count(by_role["decode"]))
    columns[3].metric("Draining", fmt.count(sum(a.get("state") == "draining" for a in agents)))
    if not agents:
        st.info("No agent has joined the Conductor.")
        return
    table([agent_row(agent) for agent in agents])


def rest_of_host_caption(other: dict[str, Any]) -> str:
    """The live profile's `host.other` in words (its background where it was measured)."""
    idle_cores = other.get("idle_cores") or 0.0
    background = f" ({idle_cores:.2f} of them whatever the load)" if idle_cores > 0 else ""
    return (
        "The rest of the host beside the agents' compute (the Conductor, clients, the agents' "
        f"other threads): {other['cores']:.2f} of its {other['cpus']} CPUs{background}, "
        f"{fmt.seconds(other['per_prefill_s'])} of CPU per prefill served beyond that; the "
        "twin crowds its agents with it as its load grows."
    )


def calibration_panel() -> None:
    """What the Conductor believes against what the agents measured (GET /v1/calibration)."""
    st.subheader("Calibration: the cost model against what the agents measure")
    try:
        calibration = client().calibration()
    except BackendError as error:
        show_error(error, "cannot read the calibration")
        return
    believed = calibration["believed"]
    columns = st.columns(4)
    columns[0].metric("Model", "calibrated" if calibration["status"] == "calibrated" else "profile")
    columns[1].metric("Refits", fmt.count(calibration["num_refits"]))
    window = calibration["window"]
    columns[2].metric("Prefills measured", fmt.count(window["num_prefill"]))
    columns[3].metric("Decode steps measured", fmt.count(window["num_decode"]))
    serving = believed.get("serving", {})
    st.caption(
        f"Believed: {believed['name']}; serving path: dispatch "
        f"{fmt.seconds(serving.get('dispatch_s'))}, answer back "
        f"{fmt.seconds(serving.get('answer_s'))}, first token "
        f"{fmt.seconds(serving.get('first_token_s'))}, per token "
        f"{fmt.seconds(serving.get('per_token_s'))}, prefill hand-over "
        f"{fmt.seconds(serving.get('handover_s'))}"
        + ("" if calibration["enabled"] else "; calibration is off (measured, not applied)")
    )
    other = (calibration.get("profile") or {}).get("host", {}).get("other")
    if other:
        st.caption(rest_of_host_caption(other))
    for note in calibration["notes"]:
        st.info(note)
    if calibration["prefill"] or calibration["decode"]:
        chart(calibration_figure(calibration), "agents-calibration")


def role_switch_form() -> None:
    st.subheader("Switch an agent's role")
    try:
        agents = client().agents()
    except BackendError:
        return  # the panel above already shows why
    if not agents:
        return
    roles = {agent["instance_id"]: agent["role"] for agent in agents}
    left, middle, right = st.columns([3, 2, 2])
    instance_id = left.selectbox(
        "Agent", list(roles), format_func=lambda i: f"{i} ({roles[i]})", key="switch_agent"
    )
    target = "decode" if roles[instance_id] == "prefill" else "prefill"
    drain_timeout_s = middle.number_input(
        "Drain timeout (s)", min_value=1.0, max_value=600.0, value=30.0, key="switch_timeout"
    )
    right.write("")
    if right.button(f"Switch to {target}…", key="switch_start"):
        st.session_state[PENDING_KEY] = (instance_id, target, float(drain_timeout_s))
    pending = st.session_state.get(PENDING_KEY)
    if pending is None:
        return
    instance_id, target, drain_timeout_s = pending
    st.warning(
        f"Switch **{instance_id}** to **{target}**? It takes no new work from now on, "
        f"finishes what it has (up to {drain_timeout_s:g} s), then serves as {target}."
    )
    confirm, cancel, _ = st.columns([1, 1, 4])
    if cancel.button("Cancel", key="switch_cancel"):
        del st.session_state[PENDING_KEY]
        st.rerun()
    if confirm.button("Confirm switch", type="primary", key="switch_confirm"):
        del st.session_state[PENDING_KEY]
        with st.spinner(f"draining {instance_id} ..."):
            try:
                view = client().switch_role(instance_id, target, drain_timeout_s=drain_timeout_s)
            except BackendError as error:
                show_error(error, f"cannot switch {instance_id}")
                return
        st.success(f"{view['instance_id']} now serves as {view['role']}.")


st.title("Agents")
refresh_s = settings().refresh_s
is_live = st.toggle(f"Refresh every {refresh_s:g} s", value=True, key="agents_refresh")
st.fragment(agents_panel, run_every=refresh_s if is_live else None)()
role_switch_form()
calibration_panel()
