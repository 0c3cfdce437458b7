"""The Agents page against the real backend: its table is GET /v1/agents's, and a role switch
needs a confirmation and the admin token, is refused readably when it would leave a role
empty, and otherwise drains and switches the agent in the running Conductor."""

import time

from console.views.agents import rest_of_host_caption
from tests.console.conftest import ADMIN_TOKEN
from tests.console.pages import errors, metrics, num_charts, open_page, sign_in_as_admin
from tests.harness.agents import AgentProcess, stop_agents
from tests.runtime.conftest import SECRET


def test_each_agents_role_state_health_and_load_are_the_backends(app, backend):
    open_page(app, "agents")
    agents = backend.get("/v1/agents")
    rows = app.dataframe[0].value.to_dict("records")
    assert [(r["agent"], r["role"], r["state"]) for r in rows] == [
        (a["instance_id"], a["role"], a["state"]) for a in agents
    ]
    for row, agent in zip(rows, agents, strict=True):
        assert row["health"] == "ok"  # beats every 0.2 s here
        assert row["queued"] == agent["load"]["num_queued"]
        assert row["batch"] == agent["load"]["batch_size"]
        assert (
            row["KV blocks"] == agent["load"]["num_dram_blocks"] + agent["load"]["num_ssd_blocks"]
        )
    shown = metrics(app)
    assert (shown["Agents"], shown["Prefill"], shown["Decode"], shown["Draining"]) == (
        "2",
        "1",
        "1",
        "0",
    )


def _ask_to_switch(app, instance_id: str):
    app.selectbox(key="switch_agent").set_value(instance_id).run()
    app.button(key="switch_start").click().run()
    return app


def test_a_switch_waits_for_confirmation_and_can_be_cancelled(app, backend):
    open_page(app, "agents")
    decode = next(a for a in backend.get("/v1/agents") if a["role"] == "decode")
    _ask_to_switch(app, decode["instance_id"])
    assert f"Switch **{decode['instance_id']}** to **prefill**?" in app.warning[0].value
    app.button(key="switch_cancel").click().run()
    assert not app.warning
    assert [a["role"] for a in backend.get("/v1/agents")] == ["decode", "prefill"]


def test_a_switch_without_the_admin_token_is_refused_clearly(app, backend):
    open_page(app, "agents")
    decode = next(a for a in backend.get("/v1/agents") if a["role"] == "decode")
    _ask_to_switch(app, decode["instance_id"]).button(key="switch_confirm").click().run()
    assert errors(app) == [
        f"cannot switch {decode['instance_id']}: this change needs the admin token: sign in "
        "with it in the sidebar"
    ]


def test_switching_the_last_agent_of_a_role_is_a_readable_409(app, backend):
    open_page(app, "agents")
    sign_in_as_admin(app, ADMIN_TOKEN)
    decode = next(a for a in backend.get("/v1/agents") if a["role"] == "decode")
    _ask_to_switch(app, decode["instance_id"]).button(key="switch_confirm").click().run()
    (message,) = errors(app)
    assert "failed (409)" in message
    assert "is the last decode instance; switching it would leave no decode instance" in message
    assert backend.get("/v1/agents")[0]["role"] == "decode"


def test_a_confirmed_switch_drains_and_switches_the_agent_and_is_audited(app, backend):
    extra = AgentProcess("decode", SECRET, "--conductor", backend.conductor.runtime.address)
    extra.wait_ready()
    try:
        deadline = time.monotonic() + 30
        while extra.instance_id not in backend.conductor.runtime.agents():
            assert time.monotonic() < deadline, "the extra agent did not join"
            time.sleep(0.05)
        open_page(app, "agents")
        sign_in_as_admin(app, ADMIN_TOKEN)
        _ask_to_switch(app, extra.instance_id).button(key="switch_confirm").click().run()
        assert not errors(app)
        assert app.success[0].value == f"{extra.instance_id} now serves as prefill."
        roles = {a["instance_id"]: a["role"] for a in backend.get("/v1/agents")}
        assert roles[extra.instance_id] == "prefill"
        latest = backend.get("/v1/audit", limit=1)[0]
        assert latest["action"] == "agent.role" and latest["actor"] == "admin"
        assert latest["new_value"] == {"instance_id": extra.instance_id, "role": "prefill"}
    finally:
        stop_agents([extra])
        deadline = time.monotonic() + 15  # leave the 1P:1D stack the other tests expect
        while extra.instance_id in backend.conductor.runtime.agents():
            assert time.monotonic() < deadline, "the stopped agent is still listed"
            time.sleep(0.1)


def test_the_calibration_panel_shows_believed_against_measured(app, backend):
    open_page(app, "agents")
    calibration = backend.get("/v1/calibration")
    assert "Calibration: the cost model against what the agents measure" in [
        h.value for h in app.subheader
    ]
    shown = metrics(app)
    assert shown["Refits"] == str(calibration["num_refits"])
    assert shown["Prefills measured"] == str(calibration["window"]["num_prefill"])
    assert calibration["window"]["num_prefill"] > 0  # the fixture's traffic was measured
    assert num_charts(app) >= 1  # the believed-vs-measured scatter
    # What the rest of the host spent, where the window measured it (agents on one host).
    other = calibration["profile"].get("host", {}).get("other")
    captions = " ".join(c.value for c in app.caption)
    assert ("The rest of the host" in captions) == (other is not None)
    if other is not None:
        assert f"of its {other['cpus']} CPUs" in captions
    assert not errors(app)


def test_the_rest_of_the_hosts_cpu_reads_as_cores_of_its_cpus_and_cpu_per_prefill():
    caption = rest_of_host_caption({"cpus": 2, "cores": 0.4123, "per_prefill_s": 0.0241})
    assert "0.41 of its 2 CPUs" in caption and "24.1 ms of CPU per prefill" in caption
    assert "whatever the load" not in caption  # a busy window: no background measured
    quiet = {"cpus": 2, "cores": 0.15, "per_prefill_s": 0.032, "idle_cores": 0.0541}
    assert "0.15 of its 2 CPUs (0.05 of them whatever the load)" in rest_of_host_caption(quiet)
