"""deploy/ for RabbitMQ as the broker, Redis as the store (issue #18): what can be checked without Docker or
Kubernetes. The compose overlay and the Kubernetes manifest parse with what they must hold, they give the
lousho services the broker's URL, and RabbitMQ's own settings file is what its node reads: a private node
started with it runs (`consumer_timeout` taken)."""

from __future__ import annotations

import pytest
import yaml

from lousho.testing.rabbitmq import RabbitMQNode
from tests.ops.test_deploy import DEPLOY, k8s_docs

CONF = DEPLOY / "rabbitmq" / "rabbitmq.conf"


def conf_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_the_compose_overlay_gives_workers_beat_and_flower_rabbitmq_as_their_broker() -> None:
    base = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    overlay = yaml.safe_load((DEPLOY / "docker-compose.rabbitmq.yml").read_text())["services"]
    rabbitmq = overlay["rabbitmq"]
    assert rabbitmq["image"].startswith("rabbitmq:3.") and "management" not in rabbitmq["image"]
    assert "/var/lib/rabbitmq" in " ".join(rabbitmq["volumes"])  # queued steps survive a restart
    mounted = next(v for v in rabbitmq["volumes"] if v.startswith("./rabbitmq/"))
    assert (DEPLOY / mounted.split(":")[0]).resolve() == CONF.resolve()
    assert "check_running" in rabbitmq["healthcheck"]["test"]
    user = rabbitmq["environment"]["RABBITMQ_DEFAULT_USER"]
    password = rabbitmq["environment"]["RABBITMQ_DEFAULT_PASS"]
    for name in ("worker", "beat", "flower"):
        assert name in base  # an overlay of the services the base file has
        assert overlay[name]["environment"]["LOUSHO_BROKER_URL"] == f"amqp://{user}:{password}@rabbitmq:5672//"
        assert overlay[name]["depends_on"]["rabbitmq"]["condition"] == "service_healthy"


def test_the_kubernetes_manifest_runs_rabbitmq_and_gives_the_lousho_pods_its_url() -> None:
    docs = k8s_docs()
    ours = {
        (d["kind"], d["metadata"]["name"]): d
        for d in docs
        if d["metadata"]["labels"].get("lousho.dev/topology") == "rabbitmq"
    }
    assert set(ours) == {
        ("Secret", "lousho-broker"),
        ("ConfigMap", "rabbitmq-config"),
        ("Service", "rabbitmq"),
        ("StatefulSet", "rabbitmq"),
    }
    secret = ours["Secret", "lousho-broker"]["stringData"]
    user, password = secret["RABBITMQ_DEFAULT_USER"], secret["RABBITMQ_DEFAULT_PASS"]
    assert secret["LOUSHO_BROKER_URL"] == f"amqp://{user}:{password}@rabbitmq:5672//"
    assert conf_lines(ours["ConfigMap", "rabbitmq-config"]["data"]["20-lousho.conf"]) == conf_lines(CONF.read_text())
    spec = ours["StatefulSet", "rabbitmq"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert ours["Service", "rabbitmq"]["spec"]["selector"] == spec["selector"]["matchLabels"]
    container = spec["template"]["spec"]["containers"][0]
    assert {"name": "data", "mountPath": "/var/lib/rabbitmq"} in container["volumeMounts"]
    pods = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    for name in ("lousho-worker", "lousho-beat", "lousho-flower"):
        sources = pods[name]["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        assert {"secretRef": {"name": "lousho-broker", "optional": True}} in sources, name


@pytest.mark.slow  # 2-7 s: out of `scripts/check --fast` (issue #33)
def test_the_runs_rabbitmq_node_runs_with_the_deploy_settings_file(rabbitmq_run_node: RabbitMQNode | None) -> None:
    """The settings file is RabbitMQ's own format: the run's node (every RabbitMQ test's) boots with its
    lines and takes them."""
    if rabbitmq_run_node is None:
        pytest.skip("the run uses the machine's RabbitMQ: no private node to read the settings of")
    assert "86400000" in rabbitmq_run_node.ctl("eval", "application:get_env(rabbit, consumer_timeout).")
