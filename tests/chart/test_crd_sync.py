"""The chart's JobQueue CRD is crds/venturi.dev_jobqueues.yaml, never a drifting copy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from .rendering import CHART, REPO, of_kind, one, render

SOURCE = REPO / "crds" / "venturi.dev_jobqueues.yaml"
TEMPLATE = CHART / "templates" / "crds" / "venturi.dev_jobqueues.yaml"
SYNC = CHART / "hack" / "sync-crds"


def embedded(template: Path, name: str) -> bytes:
    """The bytes between the template's BEGIN and END lines."""
    text = template.read_bytes()
    begin = f"#### BEGIN crds/{name}\n".encode()
    end = f"#### END crds/{name}\n".encode()
    assert text.count(begin) == 1 and text.count(end) == 1, "markers missing: run sync-crds"
    return text[text.index(begin) + len(begin) : text.index(end)]


def test_embedded_crd_is_the_source_byte_for_byte() -> None:
    assert embedded(TEMPLATE, SOURCE.name) == SOURCE.read_bytes(), (
        "charts/venturi/templates/crds/venturi.dev_jobqueues.yaml is stale: edit crds/ and run "
        "charts/venturi/hack/sync-crds"
    )


def test_every_source_crd_has_a_template_and_sync_check_passes() -> None:
    sources = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    templates = sorted(p.name for p in TEMPLATE.parent.glob("*.yaml"))
    assert sources == templates
    result = subprocess.run(
        [sys.executable, str(SYNC), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_template_says_it_is_generated() -> None:
    head = TEMPLATE.read_text(encoding="utf-8").splitlines()[1]
    assert head.startswith("GENERATED — edit crds/venturi.dev_jobqueues.yaml and run")
    assert "charts/venturi/hack/sync-crds" in head


def test_rendered_crd_equals_the_source_but_for_labels_and_annotations() -> None:
    source = yaml.safe_load(SOURCE.read_text(encoding="utf-8"))
    crd = one(render(), "CustomResourceDefinition")
    meta, source_meta = crd.pop("metadata"), source.pop("metadata")
    assert crd == source
    assert meta["name"] == source_meta["name"] == "jobqueues.venturi.dev"
    # The source's labels stay (component: crd); the release's are added.
    assert source_meta["labels"].items() <= meta["labels"].items()
    assert meta["labels"]["app.kubernetes.io/instance"] == "venturi"
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_crds_enabled_and_keep_toggles() -> None:
    kept = one(render(), "CustomResourceDefinition")
    assert kept["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    not_kept = one(render({"crds": {"keep": False}}), "CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in not_kept["metadata"].get("annotations", {})
    assert of_kind(render({"crds": {"enabled": False}}), "CustomResourceDefinition") == []
