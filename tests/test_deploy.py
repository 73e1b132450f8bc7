"""Static checks of the deployment files: Dockerfile, docker-compose.yml and deploy/kubernetes/.

None of them can run here, so these tests read them and hold them to the code: every
COMPACTION_* name is a real setting, the values load into Settings, the topics are the
defaults from contracts/events.py, and the shutdown timings leave the worker its grace period.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import typing
from collections.abc import Iterable, Mapping
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from compaction_worker.contracts.events import (
    COMPLETED_TOPIC,
    DLQ_TOPIC,
    PROPOSED_TOPIC,
    STARTED_TOPIC,
    TURNS_TOPIC,
)
from compaction_worker.local.embedded import free_port
from compaction_worker.observability.health import LIVEZ, METRICS, READYZ, HealthServer, Liveness
from compaction_worker.settings import HealthSettings, Settings, WorkerSettings

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
COMPOSE = REPO / "docker-compose.yml"
K8S = REPO / "deploy" / "kubernetes"
DEFAULT_TOPICS = {TURNS_TOPIC, STARTED_TOPIC, COMPLETED_TOPIC, PROPOSED_TOPIC, DLQ_TOPIC}
DEFAULT_SHUTDOWN_GRACE = WorkerSettings.model_fields["shutdown_grace_seconds"].default


# --- environment variable names -> settings -------------------------------------------------


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (``KafkaSettings``, ``X | None``), if any; a mapping of
    models (``profiles``) is a mapping, not a section."""
    if typing.get_origin(annotation) is dict:
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (model := _nested_model(arg)) is not None:
            return model
    return None


def _is_mapping(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is not None and isinstance(origin, type) and issubclass(origin, Mapping):
        return True
    return any(_is_mapping(arg) for arg in typing.get_args(annotation))


def setting_path(env_name: str) -> str | None:
    """The dotted Settings field an environment variable sets, or None if it sets nothing.

    ``COMPACTION_A__B`` is field ``b`` of the model in field ``a`` of Settings; a name without
    the delimiter is a top-level field, which covers the flat aliases (``COMPACTION_REDIS_URL``).
    A name that stops at a nested model, or goes below a plain value, sets nothing useful.
    """
    prefix = str(Settings.model_config.get("env_prefix", ""))
    delimiter = str(Settings.model_config.get("env_nested_delimiter", "__"))
    if not env_name.upper().startswith(prefix.upper()):
        return None
    parts = env_name[len(prefix) :].lower().split(delimiter)
    model: type[BaseModel] = Settings
    path: list[str] = []
    for index, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return None
        path.append(part)
        nested = _nested_model(field.annotation)
        rest = parts[index + 1 :]
        if not rest:
            return ".".join(path) if nested is None else None
        if nested is None:
            # A dict-valued field takes its keys from the remaining segments.
            return ".".join(path + rest) if _is_mapping(field.annotation) and all(rest) else None
        model = nested
    return None


def invalid_names(names: Iterable[str]) -> list[str]:
    """The COMPACTION_* names among ``names`` that set no setting."""
    prefix = str(Settings.model_config.get("env_prefix", "")).upper()
    return [name for name in names if name.upper().startswith(prefix) and setting_path(name) is None]


def load_settings_from(monkeypatch: pytest.MonkeyPatch, env: Mapping[str, str]) -> Settings:
    """Settings as a process with exactly these COMPACTION_* variables would read them."""
    for name in list(os.environ):
        if name.upper().startswith("COMPACTION_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        if name.upper().startswith("COMPACTION_"):
            monkeypatch.setenv(name, value)
    return Settings()


class TestSettingPath:
    """The helper that maps environment variable names onto Settings fields."""

    def test_nested_names_map_to_nested_fields(self) -> None:
        """``__`` descends into the section models."""
        assert setting_path("COMPACTION_KAFKA__BOOTSTRAP_SERVERS") == "kafka.bootstrap_servers"
        assert setting_path("COMPACTION_WORKER__SHUTDOWN_GRACE_SECONDS") == "worker.shutdown_grace_seconds"
        assert setting_path("compaction_redis__url") == "redis.url"  # names are case-insensitive

    def test_flat_aliases_are_top_level_fields(self) -> None:
        """The flat names DESIGN.md promises are accepted."""
        assert setting_path("COMPACTION_REDIS_URL") == "redis_url"
        assert setting_path("COMPACTION_KAFKA_BOOTSTRAP_SERVERS") == "kafka_bootstrap_servers"
        assert setting_path("COMPACTION_LOG_LEVEL") == "log_level"

    def test_dict_fields_take_keys(self) -> None:
        """A mapping setting accepts one more segment, the key."""
        assert (
            setting_path("COMPACTION_BUDGET__WINDOW_OVERRIDES__MY_MODEL")
            == "budget.window_overrides.my_model"
        )

    @pytest.mark.parametrize(
        "name",
        [
            "COMPACTION_KAFKA__NOPE",  # a typo in a field
            "COMPACTION_KAFKAA__BOOTSTRAP_SERVERS",  # a typo in a section
            "COMPACTION_KAFKA",  # a whole section, not a value
            "COMPACTION_LOG_LEVEL__X",  # below a plain value
            "COMPACTION_REDIS_URL__X",
            "REDIS_URL",  # not ours
        ],
    )
    def test_names_that_set_nothing(self, name: str) -> None:
        """Typos and impossible paths are rejected (pydantic-settings silently ignores them)."""
        assert setting_path(name) is None


# --- docker-compose.yml ---------------------------------------------------------------------

_INTERPOLATION = re.compile(
    r"\$\$|\$\{(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|\$(?P<bare>[A-Za-z_]\w*)"
)


def interpolate(value: str, environ: Mapping[str, str]) -> str:
    """Compose's variable substitution: ``${X}``, ``${X:-default}``, ``${X-default}``, ``$$``."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("name") or match.group("bare")
        op, arg, current = match.group("op"), match.group("arg") or "", environ.get(name)
        if op == ":-":
            return current or arg
        if op == "-":
            return arg if current is None else current
        if op in (":?", "?") and not current:
            raise LookupError(f"{name} is required: {arg}")
        return current or ""

    return _INTERPOLATION.sub(substitute, value)


def compose() -> dict[str, Any]:
    """The parsed docker-compose.yml."""
    return typing.cast(dict[str, Any], yaml.safe_load(COMPOSE.read_text()))


def compose_environment(service: str) -> dict[str, Any]:
    """A service's environment as declared (map or list syntax), before substitution."""
    raw = compose()["services"][service].get("environment", {})
    if isinstance(raw, list):
        return {item.partition("=")[0]: item.partition("=")[2] if "=" in item else None for item in raw}
    return typing.cast(dict[str, Any], raw)


def container_env(service: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a service's container gets when compose runs in ``environ``."""
    env: dict[str, str] = {}
    for name, value in compose_environment(service).items():
        if value is None:  # passed through from the shell, absent when the shell lacks it
            if name in environ:
                env[name] = environ[name]
        else:
            env[name] = interpolate(str(value), environ)
    return env


def command_text(service: str) -> str:
    """A service's command as one string (list or string form)."""
    command = compose()["services"][service].get("command", "")
    return " ".join(command) if isinstance(command, list) else str(command)


def created_topics() -> dict[str, dict[str, str]]:
    """The topics the ``topics`` service creates: name -> its kafka-topics.sh options."""
    topics: dict[str, dict[str, str]] = {}
    for line in command_text("topics").splitlines():
        if "kafka-topics.sh" in line and "--create" in line:
            options = dict(re.findall(r"--([a-z-]+)[ =]([^\s-][^\s]*)", line))
            topics[options["topic"]] = options
    return topics


def advertised_listeners() -> dict[str, str]:
    """The Kafka service's advertised listeners: name -> host:port."""
    value = str(compose_environment("kafka")["KAFKA_ADVERTISED_LISTENERS"])
    return dict(item.split("://", 1) for item in value.split(","))


class TestCompose:
    """docker-compose.yml: Kafka, Redis, the topics and two workers, wired to each other."""

    def test_parses_with_the_four_services(self) -> None:
        """The file is YAML with the kafka, redis, topics and worker services."""
        assert {"kafka", "redis", "topics", "worker"} <= set(compose()["services"])

    def test_images(self) -> None:
        """Kafka is apache/kafka, Redis redis:7-alpine; the worker is built from the Dockerfile."""
        services = compose()["services"]
        assert services["kafka"]["image"].startswith("apache/kafka:")
        assert services["topics"]["image"] == services["kafka"]["image"]
        assert services["redis"]["image"] == "redis:7-alpine"
        build = services["worker"]["build"]
        context = build if isinstance(build, str) else build.get("context", ".")
        assert (REPO / context / "Dockerfile").is_file()

    def test_kafka_is_single_node_kraft(self) -> None:
        """One node is both broker and controller, and votes for itself."""
        env = compose_environment("kafka")
        assert set(str(env["KAFKA_PROCESS_ROLES"]).split(",")) == {"broker", "controller"}
        assert str(env["KAFKA_CONTROLLER_QUORUM_VOTERS"]).startswith(f"{env['KAFKA_NODE_ID']}@")

    def test_worker_env_names_are_settings(self) -> None:
        """Every COMPACTION_* variable of the worker sets a real Settings field."""
        names = compose_environment("worker")
        assert names, "the worker has no environment"
        assert invalid_names(names) == []

    def test_env_values_are_strings_or_numbers(self) -> None:
        """Compose rejects booleans in environment maps: "true" must be quoted."""
        for service in compose()["services"]:
            for name, value in compose_environment(service).items():
                assert not isinstance(value, bool), f"{service}: {name}"

    def test_worker_env_loads_and_points_at_the_other_services(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With nothing set in the shell, the worker's settings reach kafka and redis."""
        settings = load_settings_from(monkeypatch, container_env("worker", {}))
        bootstrap = settings.kafka.bootstrap_servers
        assert bootstrap is not None
        assert bootstrap in advertised_listeners().values()  # else clients get redirected away
        assert bootstrap.split(":")[0] in compose()["services"]
        assert settings.redis.url is not None
        assert settings.redis.url.split("//")[1].split(":")[0] in compose()["services"]
        redis_password = container_env("redis", {})["REDIS_PASSWORD"]
        assert settings.redis.password is not None
        assert settings.redis.password.get_secret_value() == redis_password
        assert {
            settings.topics.turns,
            settings.topics.started,
            settings.topics.completed,
            settings.topics.proposed,
            settings.topics.dlq,
        } == (DEFAULT_TOPICS)

    def test_summarizer_comes_from_the_users_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Unset, there is no model (extractive summaries); set, it passes through unchanged."""
        assert load_settings_from(monkeypatch, container_env("worker", {})).summarizer.model is None
        shell = {
            "COMPACTION_SUMMARIZER__MODEL": "anthropic/claude-3-5-haiku",
            "COMPACTION_SUMMARIZER__API_KEY": "k",
        }
        settings = load_settings_from(monkeypatch, container_env("worker", shell))
        assert settings.summarizer.model == "anthropic/claude-3-5-haiku"
        assert settings.summarizer.api_key is not None
        assert settings.summarizer.api_key.get_secret_value() == "k"

    def test_topics_are_the_defaults_with_explicit_partitions(self) -> None:
        """The one-shot service creates exactly the default topics, with partition counts."""
        topics = created_topics()
        assert set(topics) == DEFAULT_TOPICS
        for name, options in topics.items():
            assert int(options["partitions"]) >= 1, name
            assert options["bootstrap-server"] in advertised_listeners().values(), name

    def test_every_worker_consumer_gets_a_partition(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """replicas x consumers per worker <= partitions of the turns topic, or some sit idle."""
        settings = load_settings_from(monkeypatch, container_env("worker", {}))
        worker = compose()["services"]["worker"]
        replicas = worker.get("deploy", {}).get("replicas", worker.get("scale", 1))
        assert replicas >= 2
        assert replicas * settings.kafka.consumers <= int(created_topics()[TURNS_TOPIC]["partitions"])

    def test_worker_waits_for_healthy_dependencies(self) -> None:
        """The worker starts after Kafka and Redis are healthy and the topics exist."""
        depends = compose()["services"]["worker"]["depends_on"]
        assert depends["kafka"]["condition"] == "service_healthy"
        assert depends["redis"]["condition"] == "service_healthy"
        assert depends["topics"]["condition"] == "service_completed_successfully"
        assert compose()["services"]["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"

    def test_kafka_and_redis_have_healthchecks(self) -> None:
        """service_healthy needs a healthcheck on each; Redis's uses the password."""
        services = compose()["services"]
        for name in ("kafka", "redis"):
            test = services[name]["healthcheck"]["test"]
            assert test[0] in ("CMD", "CMD-SHELL"), name
            assert len(test) > 1, name
        assert "REDIS_PASSWORD" in " ".join(services["redis"]["healthcheck"]["test"])
        assert "REDIS_PASSWORD" in command_text("redis")

    def test_stop_grace_exceeds_the_shutdown_grace(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """docker stop waits longer than the worker drains (compose's default is only 10 s)."""
        settings = load_settings_from(monkeypatch, container_env("worker", {}))
        grace = str(compose()["services"]["worker"]["stop_grace_period"])
        match = re.fullmatch(r"(\d+)s", grace)
        assert match, grace
        assert int(match.group(1)) > settings.worker.shutdown_grace_seconds


# --- deploy/kubernetes -----------------------------------------------------------------------

MANIFESTS = sorted(K8S.glob("*.yaml"))


def manifest(name: str) -> dict[str, Any]:
    """The single document of one manifest file."""
    (document,) = yaml.safe_load_all((K8S / name).read_text())
    return typing.cast(dict[str, Any], document)


def pod_spec() -> dict[str, Any]:
    """The Deployment's pod spec."""
    return typing.cast(dict[str, Any], manifest("deployment.yaml")["spec"]["template"]["spec"])


def worker_container() -> dict[str, Any]:
    """The Deployment's worker container."""
    (container,) = pod_spec()["containers"]
    return typing.cast(dict[str, Any], container)


def deployment_env() -> dict[str, str]:
    """The settings a pod gets: ConfigMap, example Secret, then the container's own env."""
    env = {**manifest("configmap.yaml")["data"], **manifest("secret.example.yaml")["stringData"]}
    for item in worker_container().get("env", []):
        env[item["name"]] = item.get("value", "pod-name" if "valueFrom" in item else "")
    return env


class TestKubernetes:
    """deploy/kubernetes: manifests that parse, refer to each other and fit the settings."""

    def test_manifests_exist(self) -> None:
        """Every manifest the brief names is there."""
        names = {path.name for path in MANIFESTS}
        expected = {
            "deployment.yaml",
            "configmap.yaml",
            "secret.example.yaml",
            "hpa.yaml",
            "pdb.yaml",
            "kustomization.yaml",
        }
        assert expected <= names
        assert (K8S / "README.md").is_file()

    @pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
    def test_manifest_parses_with_kind_and_name(self, path: Path) -> None:
        """Each document has apiVersion, kind and metadata.name."""
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        assert documents
        for document in documents:
            assert document["apiVersion"]
            assert document["kind"]
            assert document["metadata"]["name"]

    def test_kustomization_lists_existing_files(self) -> None:
        """Every resource exists; every manifest but the secret example is listed."""
        resources = manifest("kustomization.yaml")["resources"]
        for resource in resources:
            assert (K8S / resource).is_file(), resource
        listed = set(resources) | {"kustomization.yaml", "secret.example.yaml"}
        assert {path.name for path in MANIFESTS} == listed
        # Applying placeholders over the real secret would break every running pod.
        assert "secret.example.yaml" not in resources

    def test_configmap_keys_are_settings(self) -> None:
        """Every ConfigMap key is a COMPACTION_* variable that sets a real field."""
        data = manifest("configmap.yaml")["data"]
        assert data
        assert invalid_names(data) == []
        assert all(name.startswith("COMPACTION_") for name in data)
        assert all(isinstance(value, str) for value in data.values())  # Kubernetes requires strings

    def test_secret_keys_are_settings(self) -> None:
        """The example Secret's keys are real settings too."""
        secret = manifest("secret.example.yaml")
        assert secret["kind"] == "Secret"
        assert invalid_names(secret["stringData"]) == []

    def test_deployment_env_names_are_settings(self) -> None:
        """The container's own COMPACTION_* variables set real fields."""
        names = [item["name"] for item in worker_container()["env"]]
        assert invalid_names(names) == []

    def test_env_sources_exist(self) -> None:
        """envFrom names the ConfigMap and the Secret these manifests define."""
        sources = worker_container()["envFrom"]
        assert {"configMapRef": {"name": manifest("configmap.yaml")["metadata"]["name"]}} in sources
        assert {"secretRef": {"name": manifest("secret.example.yaml")["metadata"]["name"]}} in sources

    def test_pod_environment_loads(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """ConfigMap + Secret + env load into Settings without errors, with a Kafka and a Redis."""
        settings = load_settings_from(monkeypatch, deployment_env())
        assert settings.kafka.bootstrap_servers
        assert settings.redis.url
        assert settings.redis.password is not None

    def test_termination_grace_exceeds_the_shutdown_grace(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Kubernetes waits longer than the worker drains, by default and as configured."""
        grace = pod_spec()["terminationGracePeriodSeconds"]
        settings = load_settings_from(monkeypatch, deployment_env())
        assert grace > DEFAULT_SHUTDOWN_GRACE
        assert grace > settings.worker.shutdown_grace_seconds

    def test_deployment_shape(self) -> None:
        """Three replicas, a selector that matches its pods, and resource requests and limits."""
        deployment = manifest("deployment.yaml")
        assert deployment["spec"]["replicas"] == 3
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        resources = worker_container()["resources"]
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(resources[bound]), bound

    def test_runs_as_non_root_with_a_read_only_root(self) -> None:
        """Non-root, no privilege escalation, read-only root, and /tmp from an emptyDir."""
        pod, container = pod_spec(), worker_container()
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        (mount,) = (m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
        (volume,) = (v for v in pod["volumes"] if v["name"] == mount["name"])
        assert "emptyDir" in volume

    def test_pdb_and_hpa_target_the_deployment(self) -> None:
        """The PDB selects the Deployment's pods; the HPA scales the Deployment on CPU."""
        deployment = manifest("deployment.yaml")
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert manifest("pdb.yaml")["spec"]["selector"]["matchLabels"].items() <= labels.items()
        hpa = manifest("hpa.yaml")
        target = hpa["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
        assert [metric["resource"]["name"] for metric in hpa["spec"]["metrics"]] == ["cpu"]
        assert hpa["spec"]["minReplicas"] <= deployment["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]

    def test_hpa_maximum_fits_the_partitions(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """maxReplicas x consumers per pod <= the partition count topics are created with."""
        settings = load_settings_from(monkeypatch, deployment_env())
        max_replicas = manifest("hpa.yaml")["spec"]["maxReplicas"]
        assert max_replicas * settings.kafka.consumers <= settings.topics.partitions

    def test_pod_user_is_the_image_user(self) -> None:
        """runAsUser is the Dockerfile's USER, so file ownership in the image matches."""
        assert str(pod_spec()["securityContext"]["runAsUser"]) == final_user().split(":")[0]

    def test_image_is_the_one_kustomize_rewrites(self) -> None:
        """The container image name is the one kustomization.yaml's images: entry targets."""
        names = {image["name"] for image in manifest("kustomization.yaml")["images"]}
        assert worker_container()["image"].rsplit(":", 1)[0] in names

    @pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
    def test_kustomize_builds(self) -> None:
        """``kubectl kustomize`` renders the four resources (offline, no cluster needed)."""
        result = subprocess.run(
            ["kubectl", "kustomize", str(K8S)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        kinds = sorted(doc["kind"] for doc in yaml.safe_load_all(result.stdout) if doc)
        assert kinds == [
            "ConfigMap",
            "Deployment",
            "HorizontalPodAutoscaler",
            "PodDisruptionBudget",
        ]


# --- probes, timeouts and the KEDA component --------------------------------------------------

KEDA = K8S / "components" / "keda"


def image_env() -> dict[str, str]:
    """The COMPACTION_* variables the image's ENV instructions set (a pod starts with them)."""
    env: dict[str, str] = {}
    for keyword, args in final_stage():
        if keyword == "ENV":
            env.update(item.partition("=")[::2] for item in shlex.split(args) if "=" in item)
    return {name: value for name, value in env.items() if name.startswith("COMPACTION_")}


def pod_settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a worker pod reads: the image's ENV, then the ConfigMap, Secret and env."""
    return load_settings_from(monkeypatch, {**image_env(), **deployment_env()})


def keda_manifest(name: str) -> dict[str, Any]:
    (document,) = yaml.safe_load_all((KEDA / name).read_text())
    return typing.cast(dict[str, Any], document)


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of a directory (offline), as documents."""
    result = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


class TestHealthAndScaling:
    """The probes call the health port the settings open; timeouts nest; KEDA scales within the partitions."""

    def test_the_pod_serves_health_on_all_interfaces(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The image and the ConfigMap turn the port on, reachable from the kubelet."""
        health = pod_settings(monkeypatch).health
        assert health.enabled
        assert health.host == "0.0.0.0"  # the kubelet probes the pod's IP
        assert load_settings_from(monkeypatch, image_env()).health.enabled  # docker run, no ConfigMap

    def test_probes_point_at_the_configured_port_and_paths(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """startup and liveness call /livez, readiness /readyz, on the port the worker listens on."""
        health = pod_settings(monkeypatch).health
        container = worker_container()
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        paths = {}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = container[probe]["httpGet"]
            port = get["port"]
            assert (ports[port] if isinstance(port, str) else port) == health.port, probe
            paths[probe] = get["path"]
        assert paths == {"startupProbe": LIVEZ, "livenessProbe": LIVEZ, "readinessProbe": READYZ}
        annotations = manifest("deployment.yaml")["spec"]["template"]["metadata"]["annotations"]
        assert int(annotations["prometheus.io/port"]) == health.port
        assert annotations["prometheus.io/path"] == METRICS

    def test_the_image_exposes_the_health_port(self, monkeypatch: pytest.MonkeyPatch) -> None:
        exposed = {
            int(port.split("/")[0])
            for keyword, args in final_stage()
            if keyword == "EXPOSE"
            for port in args.split()
        }
        assert pod_settings(monkeypatch).health.port in exposed

    def test_probe_timeouts_outlast_the_checks(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A probe waits longer than a readiness check may take, so a slow check reads as failed, not as a timeout."""
        health = pod_settings(monkeypatch).health
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert worker_container()[probe]["timeoutSeconds"] > health.check_timeout_seconds, probe

    def test_timeouts_nest(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """LLM timeout < lock TTL (one call fits one lock lifetime); shutdown grace < termination grace."""
        settings = pod_settings(monkeypatch)
        assert settings.summarizer.timeout_seconds < settings.worker.lock_ttl_seconds
        assert settings.worker.shutdown_grace_seconds < pod_spec()["terminationGracePeriodSeconds"]

    def test_keda_component_adds_a_scaled_object_and_removes_the_hpa(self) -> None:
        """A Kustomize Component: its resources exist, and it deletes the CPU HPA by name."""
        component = keda_manifest("kustomization.yaml")
        assert component["kind"] == "Component"
        for resource in component["resources"]:
            assert (KEDA / resource).is_file(), resource
        (patch,) = component["patches"]
        deleted = yaml.safe_load(patch["patch"])
        hpa = manifest("hpa.yaml")
        assert deleted["$patch"] == "delete"
        assert (deleted["kind"], deleted["metadata"]["name"]) == (hpa["kind"], hpa["metadata"]["name"])

    def test_scaled_object_follows_the_turns_topic_lag(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The Kafka trigger watches the group, topic and brokers the workers use, with a lag threshold."""
        settings = pod_settings(monkeypatch)
        scaled = keda_manifest("scaledobject.yaml")
        target = scaled["spec"]["scaleTargetRef"]
        deployment = manifest("deployment.yaml")
        assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
        (trigger,) = scaled["spec"]["triggers"]
        assert trigger["type"] == "kafka"
        meta = trigger["metadata"]
        assert meta["bootstrapServers"] == settings.kafka.bootstrap_servers
        assert meta["consumerGroup"] == settings.kafka.group_id
        assert meta["topic"] == settings.topics.turns
        assert int(meta["lagThreshold"]) > 0
        assert meta["allowIdleConsumers"] == "false"

    def test_scaled_object_replicas_fit_the_partitions(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """min <= the Deployment's replicas <= max, and max x consumers per pod <= partitions."""
        settings = pod_settings(monkeypatch)
        spec = keda_manifest("scaledobject.yaml")["spec"]
        assert 1 <= spec["minReplicaCount"] <= manifest("deployment.yaml")["spec"]["replicas"]
        assert manifest("deployment.yaml")["spec"]["replicas"] <= spec["maxReplicaCount"]
        assert spec["maxReplicaCount"] * settings.kafka.consumers <= settings.topics.partitions

    @pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
    def test_kustomize_builds_with_the_keda_component(self, tmp_path: Path) -> None:
        """Picking the component, as the README says, renders a ScaledObject and no HPA."""
        copy = tmp_path / "kubernetes"
        shutil.copytree(K8S, copy)
        with (copy / "kustomization.yaml").open("a") as f:
            f.write("components:\n  - components/keda\n")
        kinds = sorted(doc["kind"] for doc in kustomize(copy))
        assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "ScaledObject"]


# --- Dockerfile ------------------------------------------------------------------------------


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    return [(keyword.upper(), rest.strip()) for keyword, _, rest in (item.partition(" ") for item in logical)]


def final_stage() -> list[tuple[str, str]]:
    """The instructions of the last stage (the image that runs)."""
    steps = instructions()
    start = max(index for index, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[start:]


def final_user() -> str:
    """The USER the image runs as."""
    users = [args for keyword, args in final_stage() if keyword == "USER"]
    assert users, "the final stage sets no USER"
    return users[-1]


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context (last match wins)."""
    excluded = False
    for raw in DOCKERIGNORE.read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.rstrip("/").split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(
            fnmatch(prefix, pattern) or fnmatch(prefix, pattern.removeprefix("**/")) for prefix in prefixes
        ):
            excluded = not negated
    return excluded


def readme_uv_version() -> str:
    """The uv release the README's install command pins."""
    found = re.findall(r"pip install uv==(\S+)", (REPO / "README.md").read_text())
    assert len(set(found)) == 1, found
    return str(found[0])


async def healthcheck_exit_code(command: list[str], port: int) -> int:
    """Run the HEALTHCHECK's command with this interpreter against ``port``; its exit code."""
    env = {**os.environ, "COMPACTION_HEALTH__PORT": str(port)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, *command[1:], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return await asyncio.wait_for(process.wait(), timeout=30)


class TestDockerfile:
    """The image: slim Python 3.11, non-root, the package without extras, the CLI as entrypoint."""

    def test_bases_are_slim_python_311(self) -> None:
        """Every stage starts from a slim Python 3.11 image."""
        bases = [args.split()[0] for keyword, args in instructions() if keyword == "FROM"]
        assert bases
        assert all(base.startswith("python:3.11-slim") for base in bases), bases

    def test_entrypoint_is_the_cli_and_run_is_the_default(self) -> None:
        """ENTRYPOINT ["compaction-worker"] and CMD ["run"], exec form: signals reach the worker."""
        final = dict(final_stage())
        assert json.loads(final["ENTRYPOINT"]) == ["compaction-worker"]
        assert json.loads(final["CMD"]) == ["run"]

    def test_runs_as_a_numeric_non_root_user(self) -> None:
        """USER is a uid other than 0, so Kubernetes' runAsNonRoot can verify it."""
        uid = final_user().split(":")[0]
        assert uid.isdigit()
        assert int(uid) != 0

    def test_installs_the_locked_versions_without_dev_or_embedded(self) -> None:
        """uv installs uv.lock as it is (hash-checked, refused when stale), then the project, no extras."""
        syncs = [args for keyword, args in instructions() if keyword == "RUN" and "uv sync" in args]
        assert syncs
        for args in syncs:
            assert "--locked" in args.split(), args
            assert not re.search(r"--(all-)?extras?\b", args), args
        assert "--no-install-project" not in syncs[-1], "the last sync installs the project itself"
        assert "--no-editable" in syncs[-1]
        copied = " ".join(args for keyword, args in instructions() if keyword == "COPY")
        assert "uv.lock" in copied.split()
        assert not any("pip install ." in args for keyword, args in instructions() if keyword == "RUN")

    def test_uv_is_the_release_the_readme_installs_with(self) -> None:
        """The image and the README's install command resolve the lock with the same uv release."""
        dockerfile_uv = re.findall(r"pip install uv==(\S+)", DOCKERFILE.read_text())
        assert dockerfile_uv
        assert dockerfile_uv == [readme_uv_version()]

    def test_uses_the_bundled_model_cost_map(self) -> None:
        """LiteLLM must not fetch its model registry at start-up."""
        envs = " ".join(args for keyword, args in final_stage() if keyword == "ENV")
        assert re.search(r"\bLITELLM_LOCAL_MODEL_COST_MAP=True\b", envs)

    def test_copied_files_are_in_the_build_context(self) -> None:
        """What the Dockerfile COPYs from the context is not excluded by .dockerignore."""
        sources = [
            source
            for keyword, args in instructions()
            if keyword == "COPY" and "--from=" not in args
            for source in args.split()[:-1]
        ]
        assert sources
        for source in sources:
            assert not dockerignored(source), source
        assert not dockerignored("compaction_worker/runtime/worker.py")
        assert dockerignored(".git")
        assert dockerignored("tests/test_deploy.py")
        assert dockerignored("compaction_worker/__pycache__/worker.cpython-311.pyc")

    async def test_healthcheck_probes_livez_on_the_health_port(self) -> None:
        """The HEALTHCHECK, run as written, passes while the worker is live and fails when it is not."""
        checks = [args for keyword, args in final_stage() if keyword == "HEALTHCHECK"]
        assert len(checks) == 1
        command = json.loads(checks[0].split(" CMD ", 1)[1])
        assert command[0] == "python"
        live, stale = Liveness(60), Liveness(0.001)
        servers = [
            HealthServer(HealthSettings(enabled=True, port=0), liveness, {}, CollectorRegistry())
            for liveness in (live, stale)
        ]
        for server in servers:
            await server.start()
        try:
            await asyncio.sleep(0.01)  # the stale one's loops are past their timeout
            codes = [await healthcheck_exit_code(command, server.port) for server in servers]
        finally:
            for server in servers:
                await server.stop()
        nothing_listens = await healthcheck_exit_code(command, free_port())
        assert codes == [0, 1]
        assert nothing_listens != 0


class TestReadmeCommands:
    """The README's first screen: two commands, and CI runs what they say (issues 32 and 34)."""

    @staticmethod
    def first_block() -> list[str]:
        text = (REPO / "README.md").read_text()
        block = text.split("```bash\n", 1)[1].split("```", 1)[0]
        return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]

    def test_the_first_screen_has_an_install_and_run_command_and_a_test_command(self) -> None:
        install_and_run, tests = self.first_block()
        assert install_and_run.startswith("pip install uv==")
        assert install_and_run.endswith("compaction-worker run")
        assert "uv run --locked --all-extras" in install_and_run
        assert tests == "uv run --locked --all-extras python -m pytest"

    def test_ci_installs_as_the_readme_does_and_runs_its_test_command(self) -> None:
        install_and_run, tests = self.first_block()
        ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
        install = install_and_run.split(" && ", 1)[0]
        assert install in ci
        assert tests in ci
        assert ci.index(install) < ci.index(tests)
        # The locked environment uv makes compiles its bytecode (a new process does not compile LiteLLM).
        assert re.search(r"(?m)^compile-bytecode = true$", (REPO / "pyproject.toml").read_text())
