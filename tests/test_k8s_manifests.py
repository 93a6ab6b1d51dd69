"""deploy/kubernetes/: every Kubernetes object validates against Kubernetes' own OpenAPI schemas (kubernetes-validate,
strict: unknown fields are errors) for the versions the controller needs (in-place resize: 1.33 and later); the
objects no schema covers (cert-manager's CRDs, kube-scheduler's configuration) are checked by their fields; and
the RBAC grants exactly the verbs the code uses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate")

DEPLOY = Path(__file__).parent.parent / "deploy" / "kubernetes"
VERSIONS = ["1.33", "1.34", "1.35"]
NOT_IN_OPENAPI = {"cert-manager.io/v1", "kubescheduler.config.k8s.io/v1"}


def documents() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        out += [(f"{path.name}:{doc['kind']}/{doc['metadata']['name'] if 'metadata' in doc else ''}", doc)
                for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


DOCS = documents()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("where,doc", [d for d in DOCS if d[1]["apiVersion"] not in NOT_IN_OPENAPI],
                         ids=[d[0] for d in DOCS if d[1]["apiVersion"] not in NOT_IN_OPENAPI])
def test_every_object_validates_against_kubernetes_openapi_schema(where, doc, version):
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_manifests_hold_what_docs_kubernetes_md_names():
    kinds = sorted(d["kind"] for _, d in DOCS)
    assert kinds == sorted(["Namespace", "ServiceAccount", "ServiceAccount", "ServiceAccount", "ClusterRole",
                            "ClusterRoleBinding", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                            "PersistentVolumeClaim", "Deployment", "Service", "Deployment", "PodDisruptionBudget",
                            "Deployment", "Service", "PodDisruptionBudget", "MutatingWebhookConfiguration",
                            "Issuer", "Certificate", "KubeSchedulerConfiguration"] + ["NetworkPolicy"] * 4)


def test_the_objects_without_a_schema_have_the_fields_they_need():
    by_kind = {d["kind"]: d for _, d in DOCS}
    cert = by_kind["Certificate"]["spec"]
    assert cert["secretName"] == "hetplan-webhook-tls" and "hetplan-webhook.hetplan.svc" in cert["dnsNames"]
    webhook = by_kind["MutatingWebhookConfiguration"]
    assert webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "hetplan/hetplan-webhook"
    extender = by_kind["KubeSchedulerConfiguration"]["extenders"][0]
    assert set(extender) <= {"urlPrefix", "filterVerb", "prioritizeVerb", "weight", "enableHTTPS", "httpTimeout",
                             "nodeCacheCapable", "ignorable", "managedResources", "bindVerb", "preemptVerb",
                             "tlsConfig"}  # kube-scheduler's v1.Extender fields
    assert extender["ignorable"] is True and extender["filterVerb"] == "filter"


def test_webhook_is_fail_open_and_opt_in():
    hook = next(d for _, d in DOCS if d["kind"] == "MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "NoneOnDryRun"
    assert hook["objectSelector"]["matchExpressions"] == [{"key": "hetplan.io/model", "operator": "Exists"}]


# The API calls the code makes (hetplan/allocator/k8s/controller.py, cursor.py, intents.py, lease.py, nodes.py,
# owners.py), as (resource, verb), and the names of the objects it reads and updates in its own namespace.
CONTROLLER_CALLS = {("pods", "get"), ("pods", "list"), ("pods", "watch"), ("pods", "create"), ("pods", "patch"),
                    ("pods", "delete"), ("pods/resize", "patch"), ("pods/eviction", "create"), ("leases", "get"),
                    ("leases", "create"), ("leases", "update"), ("configmaps", "get"), ("configmaps", "create"),
                    ("configmaps", "update"), ("jobs", "get"), ("jobs", "patch"), ("pytorchjobs", "get"),
                    ("pytorchjobs", "patch")}
CONTROLLER_OBJECTS = {"leases": ["hetplan-controller"],
                      "configmaps": ["hetplan-controller-cursor", "hetplan-controller-preempted",
                                     "hetplan-controller-reports"]}
NODE_SYNC_CALLS = {("nodes", "list"), ("nodes", "watch"), ("pods", "list"), ("pods", "watch")}


def rules_of(account: str) -> list[dict]:
    roles = {(d["kind"], d["metadata"]["name"]): d for _, d in DOCS if d["kind"] in ("ClusterRole", "Role")}
    return [rule for _, binding in DOCS if binding["kind"] in ("ClusterRoleBinding", "RoleBinding")
            and any(s["name"] == account for s in binding["subjects"])
            for rule in roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]["rules"]]


def granted(account: str) -> set[tuple[str, str]]:
    return {(r, v) for rule in rules_of(account) for r in rule["resources"] for v in rule["verbs"]}


def test_rbac_grants_exactly_the_verbs_the_code_uses():
    assert granted("hetplan-controller") == CONTROLLER_CALLS
    assert granted("hetplan-allocator") == NODE_SYNC_CALLS
    assert granted("hetplan-webhook") == set()  # it only calls the allocator


def test_the_controllers_own_objects_are_pinned_by_name():
    """get and update on Leases and ConfigMaps only for the controller's own objects; create (which a name cannot
    limit) alone on its own rule. Every one of the two resources must be met by a pinned rule and a create rule
    (else the loop would pass without asserting anything)."""
    pinned, created = set(), set()
    for rule in rules_of("hetplan-controller"):
        for resource in rule["resources"]:
            if resource in CONTROLLER_OBJECTS:
                if rule["verbs"] == ["create"]:
                    assert "resourceNames" not in rule
                    created.add(resource)
                else:
                    assert rule.get("resourceNames") == CONTROLLER_OBJECTS[resource], rule
                    pinned.add(resource)
    assert pinned == created == set(CONTROLLER_OBJECTS)


def deployments() -> dict[str, dict]:
    return {d["metadata"]["name"]: d for _, d in DOCS if d["kind"] == "Deployment"}


@pytest.mark.parametrize("name", ["hetplan-allocator", "hetplan-controller", "hetplan-webhook"])
def test_every_deployment_runs_hardened_with_probes_and_the_write_token(name):
    pod = deployments()[name]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert {"readinessProbe", "livenessProbe"} <= set(c)
        env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in c["env"]}
        assert env["HETPLAN_WRITE_TOKEN"] == {"name": "hetplan-tokens", "key": "write"}  # required, one Secret


def test_the_webhook_runs_apart_without_rights_and_the_controller_serves_no_webhook():
    webhook = deployments()["hetplan-webhook"]["spec"]["template"]["spec"]
    assert webhook["serviceAccountName"] == "hetplan-webhook" and webhook["automountServiceAccountToken"] is False
    assert webhook["containers"][0]["args"][0] == "webhook"
    controller = deployments()["hetplan-controller"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert controller[controller.index("--webhook-port") + 1] == "0"
    service = next(d for _, d in DOCS if d["kind"] == "Service" and d["metadata"]["name"] == "hetplan-webhook")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "webhook"


def test_network_policies_admit_only_what_each_component_serves():
    policies = {d["metadata"]["name"]: d["spec"] for _, d in DOCS if d["kind"] == "NetworkPolicy"}
    assert policies["hetplan-default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    sources = policies["hetplan-allocator"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"][0]
    assert sources["values"] == ["controller", "webhook"]
    ports = {name: [p["port"] for rule in spec["ingress"] for p in rule["ports"]] for name, spec in policies.items()
             if name != "hetplan-default-deny"}
    assert ports == {"hetplan-allocator": [8080], "hetplan-webhook": [8443], "hetplan-controller": [8081]}
