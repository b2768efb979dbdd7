"""``deploy/kubernetes``: every overlay rendered by kustomize (``tests/deploy/kustomize.py``) and
checked offline, as a cluster of the pinned version (``deploy/kubernetes/kubernetes-version``)
would take it and as the services would read it.

* Every built-in object validates against that version's OpenAPI schemas, strictly (an unknown
  field is an error), with ``kubernetes-validate``. The Gateway API's objects are custom
  resources it has no schema for: they validate against the schemas of the Gateway API's CRDs as
  the npm package ``@kubernetes-models/gateway-api`` (2.0.0, pinned by ``gateway_api/``'s lock
  file; installed with ``npm ci`` under ``.run/peers/``, Debian's Node.js first when missing)
  generates them: types, enums, patterns and limits, though not unknown fields nor the CRDs' CEL
  rules. What they route is ``test_routing.py``'s.
* What the pods get: the commands (``authio serve engine`` / ``serve control-plane`` /
  ``migrate``) of one image, the probes on the ports the commands serve, the engine's worker count
  from its CPU limit, every ConfigMap and Secret reference resolving to a rendered object and key,
  and the environment each container gets accepted by ``common.settings`` (so a misspelt variable
  or a bad value fails here, not at a pod's start).
* Scaling and disruption: the engine's HorizontalPodAutoscaler (autoscaling/v2, CPU) and both
  PodDisruptionBudgets select the pods they mean; topology spread over nodes and zones.
* The release's choices in one place: the host of ``SERVICE_BASE_URL`` becomes every Ingress,
  Gateway and HTTPRoute host, and an overlay without ``secrets.env`` does not render.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate.utils import SchemaNotFoundError
from pydantic import ValidationError

from common.settings import Settings
from devtools import DevServicesError
from tests.deploy.kustomize import (
    KUBERNETES,
    KUBERNETES_VERSION,
    OVERLAYS,
    SAMPLE_SECRETS,
    KustomizeError,
    build,
    copy_tree,
    one,
    render,
)
from tests.fixtures.installs import npm_packages
from tests.fixtures.service import ROOT

GATEWAY_API = "gateway.networking.k8s.io/"
ENV_NAMES = {str(f.validation_alias.choices[0])  # type: ignore[union-attr]
             for f in Settings.model_fields.values()}
"""Every variable ``common.settings`` reads."""
GATEWAY_API_SOURCE = Path(__file__).resolve().parent / "gateway_api"
GATEWAY_API_DIR = ROOT / ".run" / "peers" / "gateway-api-models"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Each overlay's objects, rendered with :data:`SAMPLE_SECRETS`."""
    return {o: render(tmp_path_factory.mktemp(o), o) for o in OVERLAYS}


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers of a Deployment's or Job's pod template."""
    return list(obj["spec"]["template"]["spec"]["containers"])


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in ("Deployment", "Job")]


def test_the_kubernetes_version_is_pinned_once_and_supported() -> None:
    assert KUBERNETES_VERSION.count(".") == 1, KUBERNETES_VERSION
    # kubernetes-validate refuses a version newer than its schemas.
    assert tuple(map(int, KUBERNETES_VERSION.split("."))) <= tuple(
        map(int, kubernetes_validate.latest_version().split(".")))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_pinned_kubernetes(
        rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    checked = 0
    for obj in rendered[overlay]:
        if obj["apiVersion"].startswith(GATEWAY_API):
            continue
        try:
            version = kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at "
                        f"{'.'.join(map(str, exc.path))}", pytrace=False)
        except SchemaNotFoundError:
            pytest.fail(f"{obj['kind']} {obj['apiVersion']} does not exist in Kubernetes "
                        f"{KUBERNETES_VERSION}", pytrace=False)
        assert version == KUBERNETES_VERSION
        checked += 1
    assert checked >= 4


@pytest.fixture(scope="module")
def gateway_api_validator() -> list[str]:
    """The command validating Gateway API objects (``gateway_api/validate.mjs``, a JSON array
    on its standard input), with its packages installed (``npm ci``, again only when the lock
    file changes)."""
    try:
        npm_packages(GATEWAY_API_SOURCE, GATEWAY_API_DIR, needed_by="the Kubernetes manifest tests",
                     what="@kubernetes-models/gateway-api")
    except DevServicesError as exc:
        pytest.fail(str(exc), pytrace=False)
    shutil.copyfile(GATEWAY_API_SOURCE / "validate.mjs", GATEWAY_API_DIR / "validate.mjs")
    return [str(shutil.which("node")), str(GATEWAY_API_DIR / "validate.mjs")]


def validate_gateway_api(command: list[str], objects: list[dict[str, Any]]
                         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, input=json.dumps(objects), capture_output=True, text=True,
                          timeout=60)


def test_the_gateway_api_objects_validate_against_its_crd_schemas(
        rendered: dict[str, list[dict[str, Any]]], gateway_api_validator: list[str]) -> None:
    objects = [o for o in rendered["gateway-api"] if o["apiVersion"].startswith(GATEWAY_API)]
    assert {o["kind"] for o in objects} == {"Gateway", "HTTPRoute"}
    assert {o["apiVersion"] for o in objects} == {GATEWAY_API + "v1"}  # the standard channel
    done = validate_gateway_api(gateway_api_validator, objects)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["ok"] * len(objects)
    # The validator can fail: a path match of a type the Gateway API does not have.
    broken = json.loads(json.dumps(objects))
    (engine,) = [o for o in broken if o["metadata"]["name"] == "authio-engine"]
    engine["spec"]["rules"][0]["matches"][0]["path"]["type"] = "Regex"
    done = validate_gateway_api(gateway_api_validator, broken)
    assert done.returncode == 1 and "invalid HTTPRoute authio-engine" in done.stdout


def test_strict_validation_refuses_an_unknown_field() -> None:
    """The validator of the test above can fail: a misspelt field of a probe is an error."""
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c", "image": "i", "readinessProbe": {"httpGet": {
            "path": "/readyz", "port": 8081}, "periodSecond": 5}}]}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(probe, KUBERNETES_VERSION, strict=True)


def test_the_overlays_render_what_each_step_applies(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    def label(obj: dict[str, Any]) -> str:
        name = obj["metadata"]["name"]
        if obj["kind"] in ("ConfigMap", "Secret"):  # generated: the name, then a content hash
            name = name.rsplit("-", 1)[0]
        return f"{obj['kind']}/{name}"

    kinds = {o: sorted(map(label, objs)) for o, objs in rendered.items()}
    common = ["ConfigMap/authio-config", "Namespace/authio", "Secret/authio-secrets"]
    assert kinds["migrate"] == sorted([*common, "Job/authio-migrate"])
    services = ["Deployment/authio-control-plane", "Deployment/authio-engine",
                "HorizontalPodAutoscaler/authio-engine", "PodDisruptionBudget/authio-control-plane",
                "PodDisruptionBudget/authio-engine", "Service/authio-control-plane",
                "Service/authio-engine"]
    assert kinds["ingress-nginx"] == sorted(
        [*common, *services, "Ingress/authio-control-plane", "Ingress/authio-engine"])
    assert kinds["gateway-api"] == sorted(
        [*common, *services, "Gateway/authio", "HTTPRoute/authio-control-plane",
         "HTTPRoute/authio-engine", "HTTPRoute/authio-https-redirect"])
    for objs in rendered.values():  # everything in the release's namespace
        assert {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"} == {
            "authio"}


def test_one_image_runs_the_engine_the_control_plane_and_the_migrations(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    commands = {}
    images = set()
    for objs in rendered.values():
        for w in workloads(objs):
            for c in containers(w):
                commands[w["metadata"]["name"]] = [*c["command"], *c["args"]]
                images.add(c["image"])
    assert commands == {"authio-engine": ["authio", "serve", "engine"],
                        "authio-control-plane": ["authio", "serve", "control-plane"],
                        "authio-migrate": ["authio", "migrate"]}
    assert images == {"registry.example.com/authio:0.1.0"}  # release/kustomization.yaml's


def test_probes_ask_the_port_each_command_serves(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["ingress-nginx"]
    for name, port in (("authio-engine", 8081), ("authio-control-plane", 8080)):
        (c,) = containers(one(objs, "Deployment", name))
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports == {"http": port}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        served = env["SERVICE_ENGINE_PORT" if name == "authio-engine" else "PORT"]
        assert served == str(port)  # the variable the command reads (common/settings.py)
        service = one(objs, "Service", name)
        assert service["spec"]["ports"] == [{"name": "http", "port": port, "targetPort": "http"}]
        labels = one(objs, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()


def test_the_engine_runs_one_worker_per_core_of_its_cpu_limit(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    (c,) = containers(one(rendered["ingress-nginx"], "Deployment", "authio-engine"))
    (workers,) = [e for e in c["env"] if e["name"] == "SERVICE_ENGINE_WORKERS"]
    assert workers["valueFrom"]["resourceFieldRef"] == {
        "containerName": c["name"], "resource": "limits.cpu", "divisor": "1"}
    # Requests equal to limits: the HPA's utilization is of the cores the workers use.
    assert c["resources"]["requests"]["cpu"] == c["resources"]["limits"]["cpu"]


def test_the_engine_scales_on_cpu_and_both_services_tolerate_a_disruption(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["gateway-api"]
    engine = one(objs, "Deployment", "authio-engine")
    assert "replicas" not in engine["spec"]  # the autoscaler owns the count
    hpa = one(objs, "HorizontalPodAutoscaler", "authio-engine")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "authio-engine"}
    assert hpa["spec"]["minReplicas"] >= 2
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    for name in ("authio-engine", "authio-control-plane"):
        pods = one(objs, "Deployment", name)["spec"]["template"]
        labels = pods["metadata"]["labels"]
        pdb = one(objs, "PodDisruptionBudget", name)
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert pdb["spec"]["maxUnavailable"] == 1
        spread = {t["topologyKey"]: t for t in pods["spec"]["topologySpreadConstraints"]}
        assert set(spread) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
        for t in spread.values():
            assert t["labelSelector"]["matchLabels"].items() <= labels.items()


def _environment(objs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The variables ``container`` gets from its ``env`` and ``envFrom`` (decoded Secrets),
    each reference resolved in ``objs`` (a missing object or key fails the test)."""
    def data(kind: str, name: str) -> dict[str, str]:
        matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
        assert matches, f"{kind}/{name} is referenced but not rendered"
        found = matches[0].get("data", {})
        if kind == "Secret":
            return {k: base64.b64decode(v).decode() for k, v in found.items()}
        return dict(found)

    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(data("ConfigMap", source["configMapRef"]["name"]))
        else:
            env.update(data("Secret", source["secretRef"]["name"]))
    for var in container.get("env", []):
        ref = var.get("valueFrom", {})
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "secretKeyRef" in ref:
            values = data("Secret", ref["secretKeyRef"]["name"])
            assert ref["secretKeyRef"]["key"] in values, var
            env[var["name"]] = values[ref["secretKeyRef"]["key"]]
        elif "resourceFieldRef" in ref:
            env[var["name"]] = "2"  # what the kubelet gives for the engine's limit
    return env


def test_every_container_gets_settings_the_service_accepts(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    seen = {}
    for objs in rendered.values():
        for w in workloads(objs):
            for c in containers(w):
                env = _environment(objs, c)
                unknown = sorted(set(env) - ENV_NAMES)
                assert not unknown, f"{w['metadata']['name']}: variables no setting reads: {unknown}"
                settings = Settings.model_validate(env)
                assert settings.base_url == "https://auth.example.com"
                assert settings.database_url == SAMPLE_SECRETS["DATABASE_URL"]
                seen[w["metadata"]["name"]] = (settings, env)
    control = seen["authio-control-plane"][0]
    assert control.kek() is not None and control.bootstrap_token is not None
    assert control.redis_url == SAMPLE_SECRETS["REDIS_URL"]
    assert seen["authio-engine"][0].engine_workers == 2
    assert seen["authio-engine"][0].otel_exporter == "otlp"
    # The engine and the migrations never see the key-encryption key or the bootstrap token.
    for name in ("authio-engine", "authio-migrate"):
        assert not {"SERVICE_KMS_KEY", "SERVICE_BOOTSTRAP_TOKEN"} & set(seen[name][1]), name


def test_the_example_secrets_name_every_secret_and_are_refused_until_replaced() -> None:
    example = (KUBERNETES / "release" / "secrets.env.example").read_text()
    values = dict(line.split("=", 1) for line in example.splitlines()
                  if line and not line.startswith("#"))
    assert set(values) == set(SAMPLE_SECRETS)
    with pytest.raises(ValidationError) as refused:  # placeholders cannot start a control plane
        Settings.model_validate(values)
    assert {str(e["loc"][0]) for e in refused.value.errors()} == {
        "SERVICE_KMS_KEY", "SERVICE_BOOTSTRAP_TOKEN"}


def test_an_overlay_without_secrets_does_not_render(tmp_path: Path) -> None:
    with pytest.raises(KustomizeError, match=r"secrets\.env"):
        build(copy_tree(tmp_path, secrets=None), "ingress-nginx")


@pytest.mark.parametrize("overlay", ["ingress-nginx", "gateway-api"])
def test_the_public_host_comes_from_service_base_url(tmp_path: Path, overlay: str) -> None:
    objs = render(tmp_path, overlay, config={"SERVICE_BASE_URL": "https://id.corp.example"})
    hosts = []
    for o in objs:
        if o["kind"] == "Ingress":
            hosts += [r["host"] for r in o["spec"]["rules"]]
            hosts += [h for t in o["spec"]["tls"] for h in t["hosts"]]
        elif o["kind"] == "Gateway":
            hosts += [listener["hostname"] for listener in o["spec"]["listeners"]]
        elif o["kind"] == "HTTPRoute":
            hosts += o["spec"]["hostnames"]
    assert len(hosts) >= 4
    assert set(hosts) == {"id.corp.example"}


def test_tls_is_asked_of_cert_manager_once(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """One Certificate per host: only one Ingress carries cert-manager's annotation (two would
    make two Certificates writing one Secret); every TLS section names that Secret."""
    ingresses = [o for o in rendered["ingress-nginx"] if o["kind"] == "Ingress"]
    issuers = [o["metadata"]["name"] for o in ingresses
               if "cert-manager.io/cluster-issuer" in o["metadata"].get("annotations", {})]
    assert issuers == ["authio-control-plane"]
    assert {t["secretName"] for o in ingresses for t in o["spec"]["tls"]} == {"authio-tls"}
    gateway = one(rendered["gateway-api"], "Gateway", "authio")
    assert "cert-manager.io/cluster-issuer" in gateway["metadata"]["annotations"]
    (https,) = [x for x in gateway["spec"]["listeners"] if x["protocol"] == "HTTPS"]
    assert https["tls"]["certificateRefs"] == [{"name": "authio-tls"}]
