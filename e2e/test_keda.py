"""KEDA interoperability, on the suite's real API server: KEDA's pinned CRDs (vendored in
e2e/keda/, checksummed) are installed, and examples/keda/ is applied with
strict field validation, so the example holds to KEDA's own schema. Runs in a namespace of
its own, before the scenario, and removes it."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from conftest import E2E, ROOT, CommandError, Kubectl, Object

KEDA = E2E / "keda"
EXAMPLES = (
    ROOT / "examples" / "keda" / "triggerauthentication.yaml",
    ROOT / "examples" / "keda" / "scaledobject.yaml",
)
NAMESPACE = "e2e-keda"
CRDS = ("scaledobjects.keda.sh", "triggerauthentications.keda.sh")


def keda_version() -> str:
    for line in (E2E / "versions.env").read_text().splitlines():
        if line.startswith("KEDA_VERSION="):
            return line.split("=", 1)[1]
    raise AssertionError("e2e/versions.env has no KEDA_VERSION")


@pytest.fixture(scope="module")
def keda_crds(kubectl: Kubectl) -> Iterator[None]:
    """KEDA's CRDs (unless the cluster has them: a real KEDA's are never replaced) and the
    namespace, both removed afterwards if this test made them."""
    made = []
    for name in CRDS:
        if not kubectl.exists("crd", name):
            path = KEDA / f"keda.sh_{name.split('.')[0]}.yaml"
            kubectl.run("apply", "--server-side", "--field-manager=venturi-e2e", "-f", str(path))
            made.append(name)
    for name in CRDS:
        kubectl.run("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    if kubectl.exists("namespace", NAMESPACE):
        pytest.fail(f"namespace {NAMESPACE} already exists: a previous run did not clean up")
    kubectl.run("create", "namespace", NAMESPACE)
    try:
        yield
    finally:
        kubectl.run(
            "delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s", check=False
        )
        for name in made:
            kubectl.run("delete", "crd", name, "--ignore-not-found", check=False)


def test_the_vendored_crds_are_the_pinned_ones() -> None:
    sums = dict(reversed(line.split()) for line in (KEDA / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == {f"keda.sh_{c.split('.')[0]}.yaml" for c in CRDS}
    for name, digest in sums.items():
        assert hashlib.sha256((KEDA / name).read_bytes()).hexdigest() == digest, name
    assert keda_version().startswith("v2.")


def apply_strict(kubectl: Kubectl, docs: list[Object], path: Path) -> None:
    path.write_text(yaml.safe_dump_all(docs))
    kubectl.run(
        "apply",
        "--server-side",
        "--field-manager=venturi-e2e",
        "--validate=strict",
        "-n",
        NAMESPACE,
        "-f",
        str(path),
    )


def test_the_example_scaledobject_is_accepted(
    kubectl: Kubectl, keda_crds: None, tmp_path: Path
) -> None:
    docs = [yaml.safe_load(path.read_text()) for path in EXAMPLES]
    assert [d["kind"] for d in docs] == ["TriggerAuthentication", "ScaledObject"]
    apply_strict(kubectl, docs, tmp_path / "example.yaml")
    scaled = kubectl.get("scaledobject", "myapp-worker", NAMESPACE)
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    assert trigger["metadata"]["query"].startswith("SELECT venturi_backlog(")
    assert trigger["authenticationRef"]["name"] == "venturi-db"
    auth = kubectl.get("triggerauthentication", "venturi-db", NAMESPACE)
    assert auth["spec"]["secretTargetRef"][0]["parameter"] == "connection"


def test_the_schema_is_really_checked(kubectl: Kubectl, keda_crds: None, tmp_path: Path) -> None:
    """The same example with a misspelt field is refused: the acceptance above means something."""
    bad = copy.deepcopy(yaml.safe_load(EXAMPLES[1].read_text()))
    bad["metadata"]["name"] = "misspelt"
    bad["spec"]["triggers"][0]["metdata"] = bad["spec"]["triggers"][0].pop("metadata")
    with pytest.raises(CommandError, match="metdata"):
        apply_strict(kubectl, [bad], tmp_path / "bad.yaml")
    assert not kubectl.exists("scaledobject", "misspelt", NAMESPACE)
