"""Render the chart with a real helm, and pick objects out of the result.

helm is found as $VENTURI_HELM, else `helm` on PATH, else the one e2e/build.sh builds into
${VENTURI_E2E_CACHE:-~/.cache/venturi-e2e}/helm-<HELM_VERSION>/helm (version from
e2e/versions.env). Rendering is cached per set of values: templates are pure.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "venturi"
NAMESPACE = "venturi-system"
RELEASE = "venturi"

Object = dict[str, Any]


class HelmError(Exception):
    """helm exited non-zero; the message is its stderr."""


def helm_version() -> str:
    """The pinned helm version (e2e/versions.env)."""
    versions = (REPO / "e2e" / "versions.env").read_text(encoding="utf-8")
    match = re.search(r"^HELM_VERSION=(\S+)$", versions, re.MULTILINE)
    return match.group(1) if match else "v3.21.4"


def e2e_helm() -> Path:
    """Where e2e/build.sh puts the pinned helm."""
    cache = Path(os.environ.get("VENTURI_E2E_CACHE", Path.home() / ".cache" / "venturi-e2e"))
    return cache / f"helm-{helm_version()}" / "helm"


@functools.cache
def helm_binary() -> str | None:
    for candidate in (os.environ.get("VENTURI_HELM"), os.environ.get("VENTURI_E2E_HELM")):
        if candidate:
            return candidate
    on_path = shutil.which("helm")
    if on_path:
        return on_path
    built = e2e_helm()
    return str(built) if built.is_file() and os.access(built, os.X_OK) else None


def helm(*args: str, chart: Path = CHART) -> str:
    binary = helm_binary()
    if binary is None:
        raise HelmError(
            "helm not found: set VENTURI_HELM, put helm on PATH, or build the pinned one "
            f"(as e2e/build.sh does): GOBIN={e2e_helm().parent} GOFLAGS=-mod=mod "
            f"go install helm.sh/helm/v3/cmd/helm@{helm_version()}"
        )
    result = subprocess.run(
        [binary, *args, str(chart)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "HELM_CACHE_HOME": tempfile.gettempdir() + "/venturi-helm-cache"},
    )
    if result.returncode != 0:
        raise HelmError(result.stderr.strip() or result.stdout.strip())
    return result.stdout


def _values_file(values: Object) -> str:
    with tempfile.NamedTemporaryFile(
        "w", suffix=".yaml", prefix="venturi-values-", delete=False, encoding="utf-8"
    ) as handle:
        yaml.safe_dump(values, handle)
    return handle.name


INSTALL: Object = {
    "operator": {"watchNamespaces": ["jobs"]},
    "rbac": {"secretNames": ["venturi-db"]},
}
"""What every install must set (the chart refuses to guess what the operator may see and read);
the tests' values go on top (``{"operator": {"watchNamespaces": []}}`` clears it again)."""


def template_text(
    values: Object | None = None, *, chart: Path = CHART, base: Object | None = INSTALL
) -> str:
    """`helm template` of the chart with `base`, then `values`, on top of values.yaml (helm
    merges them as `--values a --values b` does); raises HelmError."""
    paths = [_values_file(v) for v in (base or {}, values or {})]
    try:
        flags = [arg for path in paths for arg in ("--values", path)]
        return helm("template", RELEASE, "--namespace", NAMESPACE, *flags, chart=chart)
    finally:
        for path in paths:
            os.unlink(path)


@functools.cache
def _render_cached(values_json: str) -> tuple[Object, ...]:
    text = template_text(json.loads(values_json))
    return tuple(doc for doc in yaml.safe_load_all(text) if doc)


def render(values: Object | None = None) -> list[Object]:
    """The rendered objects (fresh copies: tests may change them)."""
    docs = _render_cached(json.dumps(values or {}, sort_keys=True))
    copied: list[Object] = json.loads(json.dumps(docs))
    return copied


def of_kind(docs: list[Object], kind: str) -> list[Object]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[Object], kind: str) -> Object:
    found = of_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def operator_container(docs: list[Object]) -> Object:
    containers = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: Object = containers[0]
    return container
