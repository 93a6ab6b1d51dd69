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
    assert kinds == sorted(["Namespace", "ServiceAccount", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                            "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "PersistentVolumeClaim",
                            "Deployment", "Service", "Deployment", "Service", "PodDisruptionBudget",
                            "MutatingWebhookConfiguration", "Issuer", "Certificate", "KubeSchedulerConfiguration"])


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


# The API calls the code makes (hetplan/allocator/k8s/controller.py, lease.py, nodes.py), as (resource, verb).
CONTROLLER_CALLS = {("pods", "get"), ("pods", "list"), ("pods", "watch"), ("pods", "create"), ("pods", "patch"),
                    ("pods", "delete"), ("pods/resize", "patch"), ("pods/eviction", "create"), ("leases", "get"), ("leases", "create"),
                    ("leases", "update"), ("configmaps", "get"), ("configmaps", "create"), ("configmaps", "update")}
NODE_SYNC_CALLS = {("nodes", "get"), ("nodes", "list"), ("nodes", "watch")}


def granted(account: str) -> set[tuple[str, str]]:
    roles = {(d["kind"], d["metadata"]["name"]): d for _, d in DOCS if d["kind"] in ("ClusterRole", "Role")}
    out = set()
    for _, binding in DOCS:
        if binding["kind"] in ("ClusterRoleBinding", "RoleBinding") and \
                any(s["name"] == account for s in binding["subjects"]):
            role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
            out |= {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    return out


def test_rbac_grants_exactly_the_verbs_the_code_uses():
    assert granted("hetplan-controller") == CONTROLLER_CALLS
    assert granted("hetplan-allocator") == NODE_SYNC_CALLS
