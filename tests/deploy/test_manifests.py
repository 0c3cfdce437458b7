"""The Kubernetes manifests (deploy/k8s): each overlay renders with kubectl's kustomize, every
object validates against the Kubernetes API schema, and the 8P+8D overlay is what it says:
the right replicas, GPUs, secrets, probes and ports, and command lines our CLI accepts.

No cluster here: what only a cluster can show (scheduling, the network policy enforced, a
served request) is in docs/deploy.md as not run."""

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import typer
import yaml

from backend.cli import app

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ROOT / "deploy" / "k8s" / "overlays"
KUBERNETES_VERSION = "1.30.0"
SECRET = "kvcentric-secrets"

needs_kubectl = pytest.mark.skipif(
    shutil.which("kubectl") is None,
    reason="kubectl is not installed (.ci/deps installs Debian's kubernetes-client)",
)


def render(overlay: str) -> list[dict]:
    result = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAYS / overlay)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


@needs_kubectl
@pytest.mark.parametrize("overlay", ["cpu", "gpu-8p8d"])
def test_every_object_validates_against_the_kubernetes_schema(overlay: str) -> None:
    objects = render(overlay)
    kinds = {o["kind"] for o in objects}
    expected = {"Namespace", "Deployment", "StatefulSet", "Service", "NetworkPolicy"}
    assert expected | {"ServiceMonitor"} <= kinds
    for obj in objects:
        assert obj["metadata"].get("namespace", "kvcentric") == "kvcentric"
        if obj["kind"] == "ServiceMonitor":  # a CRD: no schema in the validator
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


@needs_kubectl
def test_the_8p8d_overlay_runs_eight_gpu_agents_of_each_role() -> None:
    objects = render("gpu-8p8d")
    sets = by_kind(objects, "StatefulSet")
    for role in ("prefill", "decode"):
        spec = sets[f"kvcentric-{role}"]["spec"]
        assert spec["replicas"] == 8
        (container,) = spec["template"]["spec"]["containers"]
        args = container["args"]
        assert args[args.index("--role") + 1] == role
        assert args[args.index("--model") + 1] == "smollm2-135m"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert container["image"] == "kvcentric:cuda"
        storage = spec["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
        assert storage == "600Gi"
    conductor = by_kind(objects, "Deployment")["kvcentric-conductor"]["spec"]["template"]
    env = {e["name"]: e.get("value") for e in conductor["spec"]["containers"][0]["env"]}
    assert env["KVC_SERVED_MODEL"] == "smollm2-135m"  # the agents' model: its tokenizer


@needs_kubectl
@pytest.mark.parametrize("overlay", ["cpu", "gpu-8p8d"])
def test_each_command_line_is_one_our_cli_accepts(overlay: str, monkeypatch) -> None:
    """Parsed by the real `kvcentric` command (types, choices, required options), with the
    pod's $(VAR)s as they are before Kubernetes expands them."""
    monkeypatch.setenv("KVC_AGENT_SECRET", "a-secret-of-16-chars-or-more")
    group = typer.main.get_command(app)
    for obj in render(overlay):
        if obj["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for container in obj["spec"]["template"]["spec"]["containers"]:
            name, *rest = container["args"]
            command = group.get_command(group.make_context("kvcentric", [name]), name)
            assert command is not None, name
            command.make_context(name, list(rest))  # raises on a bad flag or value


@needs_kubectl
def test_secrets_probes_ports_and_selectors_fit_together() -> None:
    objects = render("gpu-8p8d")
    services = by_kind(objects, "Service")
    workloads = {**by_kind(objects, "Deployment"), **by_kind(objects, "StatefulSet")}
    container_ports: dict[str, set] = {}
    for name, workload in workloads.items():
        template = workload["spec"]["template"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= (
            template["metadata"]["labels"].items()
        )
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            container_ports[name] = set(ports) | set(ports.values())
            for probe in ("readinessProbe", "livenessProbe"):
                target = container[probe].get("httpGet") or container[probe]["tcpSocket"]
                assert target["port"] in ports, (name, probe)
            for env in container.get("env", []):  # secrets only by reference
                assert "value" not in env or not env["name"].endswith(("SECRET", "KEYS", "TOKEN"))
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    assert ref["name"] == SECRET
    conductor = workloads["kvcentric-conductor"]["spec"]["template"]["spec"]["containers"][0]
    assert conductor["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert conductor["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for service in services.values():  # every Service reaches pods on ports they have
        selector = service["spec"]["selector"]
        targets = [
            w["metadata"]["name"]
            for w in workloads.values()
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert targets, service["metadata"]["name"]
        for port in service["spec"]["ports"]:
            assert all(port["targetPort"] in container_ports[t] for t in targets)
    agents_grpc = services["kvcentric-conductor-agents"]["spec"]
    assert agents_grpc["publishNotReadyAddresses"] is True  # agents join before readiness
    monitor = by_kind(objects, "ServiceMonitor")["kvcentric"]["spec"]
    scraped = {e["port"] for e in monitor["endpoints"]}
    named = {p["name"] for s in services.values() for p in s["spec"]["ports"]}
    assert scraped <= named
    agent_policy = by_kind(objects, "NetworkPolicy")["kvcentric-agents"]["spec"]
    allowed = {p["port"] for rule in agent_policy["ingress"] for p in rule["ports"]}
    assert allowed == {7000, 7100, 9100}
    for role in ("prefill", "decode"):
        assert allowed <= container_ports[f"kvcentric-{role}"]
