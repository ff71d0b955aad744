"""A Kubernetes API server for the operator's tests: kmock's emulator, taught the API's semantics.

The harness serves a real HTTP API on 127.0.0.1 (a free port), writes a kubeconfig for it, and
speaks enough of Kubernetes for both the official ``kubernetes`` client (sync, in threads) and
kopf to run against it unmodified::

    async with kube_harness() as kube:
        kube.deployment("apps", "workers", replicas=1)
        with kube.api_client() as api:
            apps = kubernetes.client.AppsV1Api(api)
            await asyncio.to_thread(
                apps.patch_namespaced_deployment_scale, "workers", "apps", {"spec": {"replicas": 3}}
            )
        assert kube.get(DEPLOYMENTS, "apps", "workers")["spec"]["replicas"] == 3

        registry = kopf.OperatorRegistry()
        ...  # @kopf.daemon(..., registry=registry)
        async with run_operator(kube, registry):
            await kube.wait_for(JOBQUEUES, "apps", "jq", lambda jq: "status" in jq)

What kmock provides natively and is used as is: the HTTP server (``kmock.Server``), API discovery
(``/api``, ``/apis``, ``/apis/GROUP/VERSION``, built from ``emulator.resources``), the object store
with per-object history (``emulator.objects``, with kmock's partial-match assertions), request
recording and the reaction DSL (reactions still take precedence over everything below, e.g. to
inject a fault once: ``kube.emulator[kmock.method.PATCH, kmock.resource(DEPLOYMENTS)][:1] <<
kmock.KubernetesError(status=503)``; a request so answered changes no state), and its streaming
responses (used for watches).

What :class:`ApiServerEmulator` adds on top, through kmock's extension points (a subclass that
overrides ``_handle`` and the ``_serve_*`` fallbacks, and one more fallback for PUT):

* URL parsing fixes: kmock misparses ``/api/v1/namespaces[/NAME]`` (the collection fails with 500,
  a named namespace is read as "namespace NAME, no resource") and only knows ``watch=true``, while
  the ``kubernetes`` client sends ``watch=True``; ``/api/`` and ``/apis/`` (as that client asks)
  are served as ``/api`` and ``/apis``, and ``/api`` gets the ``serverAddressByClientCIDRs`` its
  model requires.
* Resource versions: one cluster-wide counter; every write bumps it and stamps
  ``metadata.resourceVersion``; lists carry the current one; no-op writes bump nothing (as real).
* Server-managed metadata: uid, creationTimestamp, generation (bumped on spec changes),
  ``generateName``, namespace existence (404), name conflicts (409), optimistic concurrency
  (409 on a stale resourceVersion), finalizers with ``deletionTimestamp`` and deferred deletion.
* Patches by content type: JSON patch (with ``test`` ops; failures are 422 as kopf expects),
  JSON merge patch, strategic merge patch (approximated, see the limitations; refused with 415
  for custom resources, as a real server does), and PUT for replacement.
* Subresources: ``status`` (writes to it change only ``.status``; writes to the main endpoint
  ignore ``.status``) and ``scale`` (GET/PATCH/PUT an ``autoscaling/v1`` Scale that reads and
  writes the Deployment's ``spec.replicas``).
* Watches with the real semantics: without a resourceVersion, synthetic ADDED events for what
  exists, then live changes; with one, a replay of every change after it (410 Gone once
  :meth:`KubeHarness.expire_watch_history` is called); ``sendInitialEvents`` with the closing
  bookmark; ``timeoutSeconds``; label and field selectors (also on lists, plus ``limit`` and
  ``continue``).
* CRDs: served from the CRD manifests themselves (names, scope, subresources, ``scale`` paths,
  and the OpenAPI schema's defaults, applied on every write); the CRD objects are stored too,
  so kopf's resource observer can list and watch them.
* Secrets' ``stringData`` folded into base64 ``data``; Deployments default to 1 replica.

Limitations: no admission (no schema validation, no CEL, no pruning of unknown fields), no
authentication or RBAC, no garbage collection (ownerReferences and namespace deletion cascade
nothing), no controllers (a Deployment's status changes only when a test sets it), one storage
per API version (no conversion: ``autoscaling/v1`` HPAs are not served), server-side apply is
refused with 415, and a strategic merge patch merges lists of objects by a guessed key (``name``,
``type``, ``containerPort``, ``port``, ...) rather than by the type's declared patchMergeKey.

kopf runs in a thread of its own with its own event loop (:func:`run_operator`): ``kopf.operator``
cancels every task created on its loop after it started when it stops, which on a shared loop
would include the emulator's connection handlers and the test's own tasks, and it installs signal
handlers when it runs in the main thread.
"""

# The waiting helpers take a timeout so that a test never hangs on a condition that never comes.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import base64
import bisect
import collections
import contextlib
import copy
import dataclasses
import datetime
import json
import re
import secrets
import shutil
import string
import tempfile
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import attrs
import jsonpatch
import kmock
import kopf
import kubernetes.client
import kubernetes.config
import yaml
from aiohttp import web
from kmock import Response  # type: ignore[attr-defined]  # exported, not in kmock.__all__

__all__ = [
    "BUILTIN_RESOURCES",
    "CRDS",
    "DEFAULT_TIMEOUT",
    "DEPLOYMENTS",
    "EVENTS",
    "HPAS",
    "JOBQUEUES",
    "JOBQUEUE_CRD_PATH",
    "LEASES",
    "NAMESPACES",
    "PODS",
    "SECRETS",
    "ApiServerEmulator",
    "KubeHarness",
    "OperatorRun",
    "ResourceDef",
    "ScaleDef",
    "crd_resource_defs",
    "kube_fixture",
    "kube_harness",
    "load_crd",
    "operator_settings",
    "run_operator",
]

Body = dict[str, Any]
T = TypeVar("T")

DEFAULT_TIMEOUT: Final = 10.0
"""Seconds any wait of the harness gives a condition before failing (waits end when it holds)."""

JOBQUEUE_CRD_PATH: Final = (
    Path(__file__).resolve().parents[2] / "crds" / "venturi.dev_jobqueues.yaml"
)

# Resource references accepted wherever the harness takes a `resource`: "GROUP/VERSION/PLURAL".
NAMESPACES: Final = "v1/namespaces"
SECRETS: Final = "v1/secrets"
PODS: Final = "v1/pods"
EVENTS: Final = "v1/events"
DEPLOYMENTS: Final = "apps/v1/deployments"
HPAS: Final = "autoscaling/v2/horizontalpodautoscalers"
LEASES: Final = "coordination.k8s.io/v1/leases"
CRDS: Final = "apiextensions.k8s.io/v1/customresourcedefinitions"
JOBQUEUES: Final = "venturi.dev/v1alpha1/jobqueues"

ResourceRef = str | kmock.resource
EventType = Literal["ADDED", "MODIFIED", "DELETED"]

_ALL_VERBS: Final = frozenset(
    {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
)
_TRUE_WORDS: Final = frozenset({"1", "t", "true"})  # Go's strconv.ParseBool, lower-cased
_JSON_PATCH: Final = "application/json-patch+json"
_MERGE_PATCH: Final = "application/merge-patch+json"
_STRATEGIC_PATCH: Final = "application/strategic-merge-patch+json"
_APPLY_PATCHES: Final = frozenset({"application/apply-patch+yaml", "application/apply-patch+cbor"})
# Guessed patchMergeKeys for strategic merge patches of lists of objects, in order of preference.
_MERGE_KEYS: Final = ("name", "type", "containerPort", "port", "mountPath", "devicePath", "uid")
_PRIMITIVE_MERGE_LISTS: Final = frozenset({"finalizers"})  # patchStrategy=merge lists of strings
_SERVER_METADATA: Final = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)


# --------------------------------------------------------------------------------------------
# Resource definitions
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScaleDef:
    """Where a resource keeps what its ``scale`` subresource shows (paths as tuples of keys)."""

    spec_replicas: tuple[str, ...] = ("spec", "replicas")
    status_replicas: tuple[str, ...] = ("status", "replicas")
    label_selector: tuple[str, ...] | None = None  # a string field; None: spec.selector below
    selector_from_spec: bool = False  # render spec.selector (a LabelSelector), as Deployments do


@dataclasses.dataclass(frozen=True)
class ResourceDef:
    """One served resource: discovery data plus the behaviours the emulator applies to it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: frozenset[str] = frozenset()
    categories: frozenset[str] = frozenset()
    subresources: frozenset[str] = frozenset()
    custom: bool = False  # defined by a CRD: no strategic merge patches, objects back on delete
    generation: bool = False  # keeps metadata.generation, bumped when the spec changes
    scale: ScaleDef | None = None
    schema: Mapping[str, Any] | None = None  # openAPIV3Schema, for defaulting

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def path(self) -> str:
        return f"{self.api_version}/{self.plural}"

    @property
    def ref(self) -> kmock.resource:
        return kmock.resource(group=self.group, version=self.version, plural=self.plural)

    @property
    def info(self) -> kmock.ResourceInfo:
        return kmock.ResourceInfo(
            kind=self.kind,
            singular=self.singular or self.kind.lower(),
            namespaced=self.namespaced,
            verbs=_ALL_VERBS,
            shortnames=self.short_names,
            categories=self.categories,
            subresources=self.subresources,
        )


BUILTIN_RESOURCES: Final[tuple[ResourceDef, ...]] = (
    ResourceDef(
        "",
        "v1",
        "namespaces",
        "Namespace",
        namespaced=False,
        short_names=frozenset({"ns"}),
        subresources=frozenset({"status", "finalize"}),
    ),
    ResourceDef("", "v1", "secrets", "Secret", namespaced=True),
    ResourceDef(
        "",
        "v1",
        "pods",
        "Pod",
        namespaced=True,
        short_names=frozenset({"po"}),
        categories=frozenset({"all"}),
        subresources=frozenset({"status"}),
    ),
    ResourceDef(
        "", "v1", "configmaps", "ConfigMap", namespaced=True, short_names=frozenset({"cm"})
    ),
    ResourceDef("", "v1", "events", "Event", namespaced=True, short_names=frozenset({"ev"})),
    ResourceDef(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        namespaced=True,
        short_names=frozenset({"deploy"}),
        categories=frozenset({"all"}),
        subresources=frozenset({"status", "scale"}),
        generation=True,
        scale=ScaleDef(selector_from_spec=True),
    ),
    ResourceDef(
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        namespaced=True,
        short_names=frozenset({"hpa"}),
        categories=frozenset({"all"}),
        subresources=frozenset({"status"}),
        generation=True,
    ),
    ResourceDef("events.k8s.io", "v1", "events", "Event", namespaced=True),
    ResourceDef("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True),
    ResourceDef(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        short_names=frozenset({"crd", "crds"}),
        subresources=frozenset({"status"}),
        generation=True,
    ),
)


def load_crd(path: Path) -> Body:
    """Read a CustomResourceDefinition manifest (one YAML document)."""
    crd = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
        raise ValueError(f"{path} is not a CustomResourceDefinition manifest")
    return crd


def crd_resource_defs(crd: Mapping[str, Any]) -> list[ResourceDef]:
    """The resources a CRD serves: one per served version, with its subresources and schema."""
    spec = crd["spec"]
    names = spec["names"]
    defs: list[ResourceDef] = []
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        subresources = version.get("subresources") or {}
        scale: ScaleDef | None = None
        if "scale" in subresources:
            scale_spec = subresources["scale"]
            selector_path = scale_spec.get("labelSelectorPath")
            scale = ScaleDef(
                spec_replicas=_json_path(scale_spec["specReplicasPath"]),
                status_replicas=_json_path(scale_spec["statusReplicasPath"]),
                label_selector=_json_path(selector_path) if selector_path else None,
            )
        defs.append(
            ResourceDef(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                singular=names.get("singular", ""),
                short_names=frozenset(names.get("shortNames", [])),
                categories=frozenset(names.get("categories", [])),
                subresources=frozenset(subresources),
                custom=True,
                generation=True,
                scale=scale,
                schema=(version.get("schema") or {}).get("openAPIV3Schema"),
            )
        )
    return defs


def _json_path(path: str) -> tuple[str, ...]:
    """A CRD's simple JSON path (``.spec.replicas``) as a tuple of keys."""
    return tuple(part for part in path.split(".") if part)


# --------------------------------------------------------------------------------------------
# Pure helpers: time, paths in dicts, patches, selectors, defaults
# --------------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _get_path(obj: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _set_path(obj: Body, path: Sequence[str], value: Any) -> None:
    for key in path[:-1]:
        child = obj.get(key)
        if not isinstance(child, dict):
            child = obj[key] = {}
        obj = child
    obj[path[-1]] = value


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge recursively, ``null`` deletes, the rest replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: Body = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class _Deleted:
    """A strategic merge patch's ``$patch: delete`` result for a map."""


_DELETED: Final = _Deleted()


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """An approximation of Kubernetes' strategic merge patch (see the module's limitations)."""
    if not isinstance(patch, Mapping):
        return _strip_directives(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETED
    if directive == "replace":
        return _strip_directives(patch)
    result: Body = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [item for item in result[field] if item not in value]
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        old = result.get(key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping):
            merged = strategic_merge_patch(old, value)
            if merged is _DELETED:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and isinstance(old, list):
            result[key] = _merge_lists(key, old, value)
        else:
            result[key] = _strip_directives(value)
    return result


def _merge_lists(key: str, old: list[Any], new: list[Any]) -> list[Any]:
    if key in _PRIMITIVE_MERGE_LISTS:
        return copy.deepcopy(old) + [item for item in new if item not in old]
    if any(isinstance(item, Mapping) and item.get("$patch") == "replace" for item in new):
        return [_strip_directives(item) for item in new if not _is_directive_only(item)]
    objects = [item for item in new if isinstance(item, Mapping)]
    if not objects or len(objects) != len(new) or not all(isinstance(i, Mapping) for i in old):
        return [_strip_directives(item) for item in new]
    candidates = [k for k in _MERGE_KEYS if all(k in item for item in objects + old)]
    if not candidates:
        return [_strip_directives(item) for item in new]
    merge_key = candidates[0]
    result: list[Any] = copy.deepcopy(old)
    for item in objects:
        index = next((i for i, x in enumerate(result) if x[merge_key] == item[merge_key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(_strip_directives(item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def _is_directive_only(item: Any) -> bool:
    return isinstance(item, Mapping) and all(key.startswith("$") for key in item)


def _strip_directives(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(item) for item in value]
    return copy.deepcopy(value)


LabelRequirement = tuple[str, str, frozenset[str]]  # key, operator, values
_SELECTOR_TERM = re.compile(
    r"""^\s*(?:
        !\s*(?P<absent>[\w./-]+)
      | (?P<setkey>[\w./-]+)\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\)
      | (?P<key>[\w./-]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[\w.-]*))?
    )\s*$""",
    re.VERBOSE,
)


def _split_selector(text: str) -> list[str]:
    terms: list[str] = []
    depth = 0
    current = ""
    for char in text:
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [term for term in terms if term.strip()]


def parse_label_selector(text: str) -> list[LabelRequirement]:
    """Parse ``a=b,c!=d,e in (f,g),h notin (i),j,!k``; ValueError if it is not a selector."""
    requirements: list[LabelRequirement] = []
    for term in _split_selector(text):
        match = _SELECTOR_TERM.match(term)
        if match is None:
            raise ValueError(f"unable to parse requirement: {term!r}")
        if match["absent"]:
            requirements.append((match["absent"], "!", frozenset()))
        elif match["setkey"]:
            values = frozenset(v.strip() for v in match["values"].split(",") if v.strip())
            requirements.append((match["setkey"], match["setop"], values))
        elif match["op"]:
            operator = "!=" if match["op"] == "!=" else "="
            requirements.append((match["key"], operator, frozenset({match["value"]})))
        else:
            requirements.append((match["key"], "exists", frozenset()))
    return requirements


def labels_match(labels: Mapping[str, str], requirements: Iterable[LabelRequirement]) -> bool:
    for key, operator, values in requirements:
        value = labels.get(key)
        ok = {
            "=": value is not None and value in values,
            "in": value is not None and value in values,
            "!=": value is None or value not in values,
            "notin": value is None or value not in values,
            "exists": value is not None,
            "!": value is None,
        }[operator]
        if not ok:
            return False
    return True


def label_selector_string(selector: Mapping[str, Any] | None) -> str:
    """Render a LabelSelector (matchLabels, matchExpressions) as a selector string."""
    if not selector:
        return ""
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = ",".join(sorted(expression.get("values") or []))
        terms.append(
            {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})"}.get(
                operator, key if operator == "Exists" else f"!{key}"
            )
        )
    return ",".join(terms)


FieldRequirement = tuple[tuple[str, ...], bool, str]  # path, equal (not !=), value


def parse_field_selector(text: str) -> list[FieldRequirement]:
    requirements: list[FieldRequirement] = []
    for term in _split_selector(text):
        match = re.match(r"^\s*([\w.]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if match is None:
            raise ValueError(f"invalid field selector: {term!r}")
        requirements.append((tuple(match[1].split(".")), match[2] != "!=", match[3]))
    return requirements


def fields_match(obj: Mapping[str, Any], requirements: Iterable[FieldRequirement]) -> bool:
    for path, equal, expected in requirements:
        value = _get_path(obj, path)
        actual = (
            "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        )
        if (actual == expected) != equal:
            return False
    return True


def apply_schema_defaults(value: Any, schema: Mapping[str, Any] | None) -> None:
    """Fill in an OpenAPI v3 schema's ``default`` values, in place, as the API server does."""
    if not schema:
        return
    if isinstance(value, dict):
        properties: Mapping[str, Any] = schema.get("properties") or {}
        for key, subschema in properties.items():
            if key not in value and "default" in subschema:
                value[key] = copy.deepcopy(subschema["default"])
            if key in value:
                apply_schema_defaults(value[key], subschema)
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for key, item in value.items():
                if key not in properties:
                    apply_schema_defaults(item, extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            apply_schema_defaults(item, schema["items"])


def _api_error(status: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    return kmock.KubernetesError(
        status=status, reason=reason, message=message, details=details or {"causes": []}
    )


def _not_found(rdef: ResourceDef, name: str) -> kmock.KubernetesError:
    resource = f"{rdef.plural}.{rdef.group}" if rdef.group else rdef.plural
    return _api_error(
        404,
        "NotFound",
        f'{resource} "{name}" not found',
        name=name,
        group=rdef.group,
        kind=rdef.plural,
    )


_NO_RESOURCE_MESSAGE: Final = "the server could not find the requested resource"


# --------------------------------------------------------------------------------------------
# The emulator
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Change:
    revision: int
    resource: str  # ResourceDef.path
    namespace: str | None
    type: EventType
    object: Body


@dataclasses.dataclass(frozen=True)
class _ApiPath:
    resource: kmock.resource | None  # None: not a Kubernetes API path at all
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def _parse_api_path(path: str) -> _ApiPath:
    parts = [part for part in path.split("/") if part]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return _ApiPath(None)
    namespace: str | None = None
    namespace_subresource = group == "" and len(rest) == 3 and rest[2] in {"status", "finalize"}
    if len(rest) >= 3 and rest[0] == "namespaces" and not namespace_subresource:
        namespace, rest = rest[1], rest[2:]
    return _ApiPath(
        resource=kmock.resource(group=group, version=version, plural=rest[0] if rest else None),
        namespace=namespace,
        name=rest[1] if len(rest) > 1 else None,
        subresource="/".join(rest[2:]) or None,
    )


def _guess_action(method: str, name: str | None, params: Mapping[str, str]) -> kmock.action | None:
    if method == "GET":
        if params.get("watch", "").lower() in _TRUE_WORDS:
            return kmock.action.WATCH
        return kmock.action.FETCH if name else kmock.action.LIST
    if method == "POST" and name is None:
        return kmock.action.CREATE
    if method == "PATCH" and name is not None:
        return kmock.action.UPDATE
    if method == "DELETE" and name is not None:
        return kmock.action.DELETE
    return None  # PUT is served by its own fallback; other combinations are not served


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesEmulator):
    """kmock's KubernetesEmulator with the API server's semantics (see the module docstring).

    Writes through the HTTP API and through the harness's helpers share one code path; the
    helpers are "privileged" only in that they may set ``.status`` on the main endpoint and
    that they create a missing namespace instead of failing.
    """

    _defs: dict[kmock.resource, ResourceDef] = attrs.field(factory=dict, init=False)
    _kinds: dict[tuple[str, str], ResourceDef] = attrs.field(factory=dict, init=False)
    _revision: int = attrs.field(default=1, init=False)
    _compacted: int = attrs.field(default=0, init=False)
    _log: list[_Change] = attrs.field(factory=list, init=False)
    _tick: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _watching: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback[kmock.method.PUT] << self._serve_replace

    # ---- registry ------------------------------------------------------------------------

    def define(self, rdef: ResourceDef) -> None:
        """Serve a resource: in discovery, and for every verb."""
        self._defs[rdef.ref] = rdef
        self._kinds[rdef.api_version, rdef.kind] = rdef
        self.resources[rdef.ref] = rdef.info

    def install_crd(self, crd: Mapping[str, Any]) -> Body:
        """Serve a CRD's resources and store the CRD itself, as established."""
        for rdef in crd_resource_defs(crd):
            self.define(rdef)
        body = copy.deepcopy(dict(crd))
        body["status"] = {
            "acceptedNames": copy.deepcopy(crd["spec"]["names"]),
            "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"},
            ],
        }
        return self.create_object(self.resolve(CRDS), None, body, privileged=True)

    def resolve(self, resource: ResourceRef) -> ResourceDef:
        ref = resource if isinstance(resource, kmock.resource) else kmock.resource(resource)
        try:
            return self._defs[ref]
        except KeyError:
            raise KeyError(f"the emulator does not serve {resource!r}") from None

    def resolve_kind(self, api_version: str, kind: str) -> ResourceDef:
        try:
            return self._kinds[api_version, kind]
        except KeyError:
            raise KeyError(f"the emulator does not serve {api_version}/{kind}") from None

    # ---- state: reading ------------------------------------------------------------------

    @property
    def revision(self) -> int:
        """The cluster-wide resource version of the last write."""
        return self._revision

    def find_object(self, rdef: ResourceDef, namespace: str | None, name: str) -> Body | None:
        key = (rdef.ref, namespace if rdef.namespaced else None, name)
        if key not in self.objects:
            return None
        stored = self.objects[key]
        return None if stored.deleted else copy.deepcopy(stored.raw)

    def list_objects(self, rdef: ResourceDef, namespace: str | None = None) -> list[Body]:
        """Live objects of a resource (all namespaces if None), ordered by namespace and name."""
        found = [
            (ns or "", name, stored)
            for (resource, ns, name), stored in self.objects.items()
            if resource == rdef.ref and not stored.deleted and namespace in (None, ns)
        ]
        return [copy.deepcopy(stored.raw) for _, _, stored in sorted(found, key=lambda x: x[:2])]

    def open_watches(self, resource: ResourceRef | None = None) -> int:
        """How many watch streams are being served (for one resource, or in total)."""
        if resource is None:
            return sum(self._watching.values())
        return self._watching[self.resolve(resource).path]

    async def wait_until(
        self, condition: Callable[[], T | None], *, timeout: float = DEFAULT_TIMEOUT, what: str = ""
    ) -> T:
        """Re-check a condition after every write (and watch start/stop) until it is truthy."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    tick = self._tick
                    result = condition()
                    if result:
                        return result
                    await tick.wait()
        except TimeoutError:
            raise TimeoutError(f"not within {timeout}s: {what or condition!r}") from None

    def expire_watch_history(self) -> None:
        """Forget the changes so far: watches from an older resourceVersion get 410 Gone."""
        self._compacted = self._revision

    def close_watches(self) -> None:
        """End every watch stream, as an API server does when it shuts down."""
        self._closing = True
        self._notify()

    # ---- state: writing --------------------------------------------------------------------

    def create_object(
        self,
        rdef: ResourceDef,
        namespace: str | None,
        body: Mapping[str, Any],
        *,
        privileged: bool = False,
        dry_run: bool = False,
    ) -> Body:
        if not isinstance(body, Mapping):
            raise _api_error(400, "BadRequest", "the body must be an object")
        obj = copy.deepcopy(dict(body))
        self._check_type(rdef, obj)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise _api_error(400, "BadRequest", "metadata must be an object")
        if rdef.namespaced:
            namespace = namespace or meta.get("namespace")
            if not namespace:
                raise _api_error(400, "BadRequest", "the namespace of the object is not set")
            if meta.get("namespace", namespace) != namespace:
                raise _api_error(
                    400, "BadRequest", "the namespace of the object does not match the URL"
                )
            meta["namespace"] = namespace
            if self.find_object(self.resolve(NAMESPACES), None, namespace) is None:
                if not privileged:
                    raise _not_found(self.resolve(NAMESPACES), namespace)
                self.create_object(
                    self.resolve(NAMESPACES), None, {"metadata": {"name": namespace}}
                )
        else:
            namespace = None
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _api_error(422, "Invalid", "metadata.name: Required value: name is required")
            alphabet = string.ascii_lowercase + string.digits
            suffix = "".join(secrets.choice(alphabet) for _ in range(5))
            meta["name"] = f"{meta['generateName']}{suffix}"
        name = meta["name"]
        if self.find_object(rdef, namespace, name) is not None:
            raise _api_error(
                409, "AlreadyExists", f'{rdef.plural} "{name}" already exists', name=name
            )
        for field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(field, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        if rdef.generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        if "status" in rdef.subresources and not privileged:
            obj.pop("status", None)
        self._apply_type_rules(rdef, obj, None)
        if dry_run:
            meta["resourceVersion"] = str(self._revision)
            return obj
        return self._commit(rdef, namespace, name, obj, "ADDED")

    def update_object(
        self,
        rdef: ResourceDef,
        namespace: str | None,
        name: str,
        change: Callable[[Body], Any],
        *,
        subresource: str | None = None,
        privileged: bool = False,
        dry_run: bool = False,
    ) -> Body:
        """Apply ``change`` (old view -> new view) to an object or to its status/scale view."""
        namespace = namespace if rdef.namespaced else None
        if subresource is not None and subresource not in rdef.subresources:
            raise _api_error(404, "NotFound", _NO_RESOURCE_MESSAGE, name=name)
        old = self.find_object(rdef, namespace, name)
        if old is None:
            raise _not_found(rdef, name)
        if subresource == "scale":
            scale = change(self.scale_view(rdef, old))
            new = self._from_scale(rdef, old, scale)
        else:
            candidate = change(copy.deepcopy(old))
            if not isinstance(candidate, dict):
                raise _api_error(422, "Invalid", "the patched object is not an object")
            new = self._merge_update(rdef, old, candidate, subresource, privileged)
        result = self._store_update(rdef, old, new, dry_run=dry_run)
        return self.scale_view(rdef, result) if subresource == "scale" else result

    def delete_object(
        self,
        rdef: ResourceDef,
        namespace: str | None,
        name: str,
        *,
        preconditions: Mapping[str, Any] | None = None,
        dry_run: bool = False,
    ) -> Body:
        """Delete now, or mark for deletion while finalizers remain; return the last state."""
        namespace = namespace if rdef.namespaced else None
        old = self.find_object(rdef, namespace, name)
        if old is None:
            raise _not_found(rdef, name)
        meta = old["metadata"]
        for field in ("uid", "resourceVersion"):
            wanted = (preconditions or {}).get(field)
            if wanted is not None and wanted != meta.get(field):
                raise _api_error(
                    409,
                    "Conflict",
                    f"Precondition failed: {field}: {wanted}, in object meta: {meta.get(field)}",
                    name=name,
                    kind=rdef.plural,
                )
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return old
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = _now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            if rdef.generation:
                new["metadata"]["generation"] = meta.get("generation", 0) + 1
            return new if dry_run else self._commit(rdef, namespace, name, new, "MODIFIED")
        return old if dry_run else self._commit(rdef, namespace, name, old, "DELETED")

    def scale_view(self, rdef: ResourceDef, obj: Mapping[str, Any]) -> Body:
        """The ``autoscaling/v1`` Scale of an object, as its ``scale`` subresource shows it."""
        if rdef.scale is None:
            raise _api_error(404, "NotFound", _NO_RESOURCE_MESSAGE)
        meta = obj["metadata"]
        if rdef.scale.selector_from_spec:
            selector = label_selector_string(_get_path(obj, ("spec", "selector")))
        elif rdef.scale.label_selector is not None:
            selector = _get_path(obj, rdef.scale.label_selector) or ""
        else:
            selector = ""
        status: Body = {"replicas": _get_path(obj, rdef.scale.status_replicas) or 0}
        if selector:
            status["selector"] = selector
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in _SERVER_METADATA if k in meta},
            "spec": {"replicas": _get_path(obj, rdef.scale.spec_replicas) or 0},
            "status": status,
        }

    def _from_scale(self, rdef: ResourceDef, old: Body, scale: Any) -> Body:
        assert rdef.scale is not None  # scale_view() refused the others
        if not isinstance(scale, Mapping):
            raise _api_error(400, "BadRequest", "a Scale must be an object")
        wanted_version = _get_path(scale, ("metadata", "resourceVersion"))
        if wanted_version not in (None, "", old["metadata"]["resourceVersion"]):
            raise _conflict(rdef, old["metadata"]["name"])
        replicas = _get_path(scale, ("spec", "replicas"))
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise _api_error(
                422,
                "Invalid",
                f'Scale.autoscaling "{old["metadata"]["name"]}" is invalid: spec.replicas: '
                f"Invalid value: {replicas!r}: must be a non-negative integer",
            )
        new = copy.deepcopy(old)
        _set_path(new, rdef.scale.spec_replicas, replicas)
        self._bump_generation(rdef, old, new)
        return new

    def _merge_update(
        self,
        rdef: ResourceDef,
        old: Body,
        candidate: Body,
        subresource: str | None,
        privileged: bool,
    ) -> Body:
        self._check_type(rdef, candidate)
        meta = candidate.get("metadata")
        if not isinstance(meta, dict):
            meta = candidate["metadata"] = {}
        old_meta = old["metadata"]
        if meta.get("resourceVersion") not in (None, "", old_meta["resourceVersion"]):
            raise _conflict(rdef, old_meta["name"])
        if subresource == "status":
            new = copy.deepcopy(old)
            if "status" in candidate:
                new["status"] = candidate["status"]
            else:
                new.pop("status", None)
        else:
            new = candidate
            if "status" in rdef.subresources and not privileged:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            for field in _SERVER_METADATA:
                if field in old_meta:
                    meta[field] = old_meta[field]
                else:
                    meta.pop(field, None)
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if old_meta.get("deletionTimestamp") and added:
                raise _api_error(
                    422,
                    "Invalid",
                    f"metadata.finalizers: Forbidden: no new finalizers can be added if the object"
                    f" is being deleted, found new finalizers {sorted(added)!r}",
                )
        self._apply_type_rules(rdef, new, old)
        self._bump_generation(rdef, old, new)
        return new

    def _store_update(self, rdef: ResourceDef, old: Body, new: Body, *, dry_run: bool) -> Body:
        if new == old:
            return old  # a no-op: no new resourceVersion, no watch event
        if dry_run:
            return new
        meta = new["metadata"]
        namespace, name = meta.get("namespace"), meta["name"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._commit(rdef, namespace, name, new, "DELETED")
        return self._commit(rdef, namespace, name, new, "MODIFIED")

    def _commit(
        self, rdef: ResourceDef, namespace: str | None, name: str, obj: Body, kind: EventType
    ) -> Body:
        self._revision += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self._revision)
        key = (rdef.ref, namespace, name)
        if kind == "DELETED":
            self.objects[key].delete()
        elif key not in self.objects:
            self.objects[key] = copy.deepcopy(obj)
        elif self.objects[key].deleted:
            self.objects[key].create(copy.deepcopy(obj))
        else:
            self.objects[key].history.append(copy.deepcopy(obj))
        self._log.append(_Change(self._revision, rdef.path, namespace, kind, copy.deepcopy(obj)))
        self._notify()
        return obj

    def _notify(self) -> None:
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    @staticmethod
    def _check_type(rdef: ResourceDef, obj: Mapping[str, Any]) -> None:
        for field, expected in (("apiVersion", rdef.api_version), ("kind", rdef.kind)):
            if obj.get(field, expected) != expected:
                raise _api_error(
                    400, "BadRequest", f"{field} {obj.get(field)!r} does not match {expected!r}"
                )

    @staticmethod
    def _bump_generation(rdef: ResourceDef, old: Body, new: Body) -> None:
        if not rdef.generation:
            return

        def spec_of(obj: Body) -> Body:
            return {k: v for k, v in obj.items() if k not in {"metadata", "status"}}

        if spec_of(new) != spec_of(old):
            new["metadata"]["generation"] = old["metadata"].get("generation", 0) + 1

    @staticmethod
    def _apply_type_rules(rdef: ResourceDef, obj: Body, old: Body | None) -> None:
        """What the API server's registries and defaulting do per type (only what is emulated)."""
        obj["apiVersion"], obj["kind"] = rdef.api_version, rdef.kind
        if rdef.path == SECRETS and "stringData" in obj:
            data = obj.setdefault("data", {})
            for key, value in (obj.pop("stringData") or {}).items():
                data[key] = base64.b64encode(str(value).encode()).decode()
        elif rdef.path == NAMESPACES and old is None:
            obj.setdefault("status", {"phase": "Active"})
        elif rdef.path == DEPLOYMENTS and isinstance(obj.get("spec"), dict):
            obj["spec"].setdefault("replicas", 1)
        if rdef.schema is not None:
            apply_schema_defaults(obj, rdef.schema)

    # ---- HTTP ------------------------------------------------------------------------------

    async def __call__(self, raw_request: web.BaseRequest) -> web.StreamResponse:
        # The official client asks for `/api/` and `/apis/`: serve those as `/api` and `/apis`.
        if len(raw_request.path) > 1 and raw_request.path.endswith("/"):
            path = raw_request.path.rstrip("/") or "/"
            raw_request = raw_request.clone(rel_url=raw_request.rel_url.with_path(path))
        # kmock's URL parser raises on namespaces' collection URL (`/api/v1/namespaces`) before
        # any handler runs, so build the request for those here and serve it the same way.
        if _parse_api_path(raw_request.path) != _ApiPath(kmock.resource(NAMESPACES)):
            return await super().__call__(raw_request)
        body = await raw_request.read()
        request = kmock.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=raw_request.method,
            params=dict(raw_request.query),
            headers=dict(raw_request.headers),
            cookies=dict(raw_request.cookies),
            body=body,
            text=body.decode("utf-8", errors="replace"),
            data=_loads_or_none(body),
        )
        self._requests.append(request)
        try:
            return await self._handle(request)
        except Exception as e:
            if not self._errors:
                raise
            # kmock wraps the errors of streams as StreamingError(response) from the cause.
            streamed = e.args[0] if e.args and isinstance(e.args[0], web.StreamResponse) else None
            error = e.__cause__ if streamed and isinstance(e.__cause__, Exception) else e
            self._errors[-1].append(error)
            if streamed is not None and streamed.prepared:
                await streamed.write_eof()
                return streamed
            return await self._render_error(error)

    async def _handle(self, request: kmock.Request) -> web.StreamResponse:
        # Re-derive the Kubernetes fields of the request (see __call__ and the module docstring),
        # then match the reactions & fallbacks as kmock does, but without KubernetesEmulator's
        # own state tracking: the fallbacks below keep the state.
        parsed = _parse_api_path(request.url.path)
        if parsed.resource is not None:
            fixed = attrs.evolve(
                request,
                resource=parsed.resource,
                namespace=parsed.namespace,
                name=parsed.name,
                subresource=parsed.subresource,
                action=_guess_action(request.method.value, parsed.name, request.params)
                if parsed.resource.plural
                else request.action,
            )
            for index in range(len(self._requests) - 1, -1, -1):
                if self._requests[index] is request:
                    self._requests[index] = fixed
                    break
            request = fixed
        return await kmock.RawHandler._handle(self, request)

    async def _serve_api(self, request: kmock.Request) -> kmock.Payload:
        # kmock omits serverAddressByClientCIDRs, which the official client's model requires.
        address = f"{request.url.host}:{request.url.port}"
        cidrs = [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": cidrs}

    def _resolve_request(self, request: kmock.Request) -> tuple[ResourceDef, str | None]:
        rdef = self._defs.get(request.resource) if request.resource is not None else None
        if rdef is None:
            raise _api_error(404, "NotFound", _NO_RESOURCE_MESSAGE)
        if not rdef.namespaced and request.namespace is not None:
            raise _api_error(404, "NotFound", _NO_RESOURCE_MESSAGE)
        if rdef.namespaced and request.name is not None and request.namespace is None:
            raise _api_error(404, "NotFound", _NO_RESOURCE_MESSAGE)
        return rdef, request.namespace

    @staticmethod
    def _json_body(request: kmock.Request) -> Any:
        try:
            return json.loads(request.body) if request.body else None
        except ValueError as e:
            raise _api_error(400, "BadRequest", f"the body is not JSON: {e}") from None

    @staticmethod
    def _dry_run(request: kmock.Request) -> bool:
        return request.params.get("dryRun") == "All"

    async def _serve_fetch(self, request: kmock.Request) -> kmock.Payload:
        rdef, namespace = self._resolve_request(request)
        assert request.name is not None  # FETCH has a name
        if request.subresource is not None and request.subresource not in rdef.subresources:
            raise _api_error(404, "NotFound", _NO_RESOURCE_MESSAGE)
        obj = self.find_object(rdef, namespace, request.name)
        if obj is None:
            raise _not_found(rdef, request.name)
        if request.subresource == "scale":
            obj = self.scale_view(rdef, obj)
        return Response(status=200, payload=obj)

    async def _serve_list(self, request: kmock.Request) -> kmock.Payload:
        rdef, namespace = self._resolve_request(request)
        matches = self._matcher(request)
        items = [obj for obj in self.list_objects(rdef, namespace) if matches(obj)]
        meta: Body = {"resourceVersion": str(self._revision)}
        start = 0
        if token := request.params.get("continue"):
            try:
                start = int(json.loads(base64.b64decode(token))["start"])
            except (ValueError, KeyError, TypeError):
                raise _api_error(400, "BadRequest", "invalid continue token") from None
        limit = int(request.params.get("limit") or 0)
        if limit > 0 and start + limit < len(items):
            token = base64.b64encode(json.dumps({"start": start + limit}).encode()).decode()
            meta["continue"] = token
            meta["remainingItemCount"] = len(items) - start - limit
            items = items[start : start + limit]
        else:
            items = items[start:]
        body = {"apiVersion": rdef.api_version, "kind": f"{rdef.kind}List", "metadata": meta}
        return Response(status=200, payload={**body, "items": items})

    async def _serve_create(self, request: kmock.Request) -> kmock.Payload:
        rdef, namespace = self._resolve_request(request)
        if request.subresource is not None:
            raise _api_error(405, "MethodNotAllowed", "the server does not allow this method")
        obj = self.create_object(
            rdef, namespace, self._json_body(request), dry_run=self._dry_run(request)
        )
        return Response(status=201, payload=obj)

    async def _serve_update(self, request: kmock.Request) -> kmock.Payload:
        rdef, namespace = self._resolve_request(request)
        assert request.name is not None  # UPDATE has a name
        content_type = _content_type(request)
        patch = self._json_body(request)
        scale = request.subresource == "scale"

        def change(old: Body) -> Any:
            if content_type == _JSON_PATCH:
                if not isinstance(patch, list):
                    raise _api_error(400, "BadRequest", "a JSON patch must be a list of operations")
                try:
                    return jsonpatch.apply_patch(old, patch)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                    raise _api_error(422, "Invalid", f"the JSON patch failed: {e}") from None
            if not isinstance(patch, Mapping):
                raise _api_error(400, "BadRequest", "a merge patch must be an object")
            if content_type == _MERGE_PATCH:
                return merge_patch(old, patch)
            if content_type == _STRATEGIC_PATCH and (scale or not rdef.custom):
                return strategic_merge_patch(old, patch)
            accepted = [_JSON_PATCH, _MERGE_PATCH] + ([] if rdef.custom else [_STRATEGIC_PATCH])
            raise _api_error(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(accepted)} (server-side apply is not emulated)",
            )

        obj = self.update_object(
            rdef,
            namespace,
            request.name,
            change,
            subresource=request.subresource,
            dry_run=self._dry_run(request),
        )
        return Response(status=200, payload=obj)

    async def _serve_replace(self, request: kmock.Request) -> kmock.Payload:
        if request.resource is None or not request.resource.plural or request.name is None:
            raise kmock.KubernetesEndpointNotFoundError()
        rdef, namespace = self._resolve_request(request)
        body = self._json_body(request)
        if not isinstance(body, Mapping):
            raise _api_error(400, "BadRequest", "the body must be an object")
        if _get_path(body, ("metadata", "name")) not in (None, request.name):
            raise _api_error(400, "BadRequest", "the name of the object does not match the URL")
        obj = self.update_object(
            rdef,
            namespace,
            request.name,
            lambda _: copy.deepcopy(dict(body)),
            subresource=request.subresource,
            dry_run=self._dry_run(request),
        )
        return Response(status=200, payload=obj)

    async def _serve_delete(self, request: kmock.Request) -> kmock.Payload:
        rdef, namespace = self._resolve_request(request)
        assert request.name is not None  # DELETE has a name
        if request.subresource is not None:
            raise _api_error(405, "MethodNotAllowed", "the server does not allow this method")
        options = self._json_body(request) or {}
        last = self.delete_object(
            rdef,
            namespace,
            request.name,
            preconditions=options.get("preconditions") if isinstance(options, Mapping) else None,
            dry_run=self._dry_run(request),
        )
        if rdef.custom or last["metadata"].get("finalizers"):
            return Response(status=200, payload=last)
        details = {"name": request.name, "group": rdef.group, "kind": rdef.plural}
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
        return Response(
            status=200, payload={**status, "details": {**details, "uid": last["metadata"]["uid"]}}
        )

    def _matcher(self, request: kmock.Request) -> Callable[[Mapping[str, Any]], bool]:
        try:
            labels = parse_label_selector(request.params.get("labelSelector", ""))
            fields = parse_field_selector(request.params.get("fieldSelector", ""))
        except ValueError as e:
            raise _api_error(400, "BadRequest", str(e)) from None

        def matches(obj: Mapping[str, Any]) -> bool:
            obj_labels = _get_path(obj, ("metadata", "labels")) or {}
            return labels_match(obj_labels, labels) and fields_match(obj, fields)

        return matches

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[kmock.Payload]:
        rdef, namespace = self._resolve_request(request)
        selected = self._matcher(request)

        def matches(obj: Mapping[str, Any]) -> bool:
            return request.name in (None, obj["metadata"]["name"]) and selected(obj)

        params = request.params
        since = params.get("resourceVersion") or "0"
        if not since.isdigit():
            raise _api_error(400, "BadRequest", f"invalid resource version: {since!r}")
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        initial = params.get("sendInitialEvents", "").lower() in _TRUE_WORDS

        yield b""  # send the headers now: the client is watching even if nothing happens
        self._watching[rdef.path] += 1
        self._notify()
        try:
            if initial or since == "0":
                position = len(self._log)
                for obj in self.list_objects(rdef, namespace):
                    if matches(obj):
                        yield {"type": "ADDED", "object": obj}
                if initial:
                    annotations = {"k8s.io/initial-events-end": "true"}
                    meta = {"resourceVersion": str(self._revision), "annotations": annotations}
                    bookmark = {"apiVersion": rdef.api_version, "kind": rdef.kind, "metadata": meta}
                    yield {"type": "BOOKMARK", "object": bookmark}
            elif int(since) < self._compacted:
                message = f"too old resource version: {since} ({self._compacted})"
                error = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
                yield {
                    "type": "ERROR",
                    "object": {**error, "reason": "Expired", "message": message, "code": 410},
                }
                return
            else:
                revisions = [change.revision for change in self._log]
                position = bisect.bisect_right(revisions, int(since))
            while not self._closing:
                while position < len(self._log):
                    change = self._log[position]
                    position += 1
                    ours = change.resource == rdef.path and namespace in (None, change.namespace)
                    if ours and matches(change.object):
                        yield {"type": change.type, "object": copy.deepcopy(change.object)}
                tick = self._tick
                if position == len(self._log) and not self._closing:
                    try:
                        async with asyncio.timeout_at(deadline):
                            await tick.wait()
                    except TimeoutError:
                        return
        finally:
            self._watching[rdef.path] -= 1
            self._notify()


def _conflict(rdef: ResourceDef, name: str) -> kmock.KubernetesError:
    resource = f"{rdef.plural}.{rdef.group}" if rdef.group else rdef.plural
    return _api_error(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        name=name,
        group=rdef.group,
        kind=rdef.plural,
    )


def _content_type(request: kmock.Request) -> str:
    for key, value in request.headers.items():
        if key.lower() == "content-type":
            return value.split(";")[0].strip().lower()
    return ""


def _loads_or_none(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------
# The harness: the served emulator, its kubeconfig, clients, seeding and waiting
# --------------------------------------------------------------------------------------------


class KubeHarness:
    """A running emulator: its URL, a kubeconfig, client factories, and test-side helpers.

    Helpers that write (``create``, ``patch``, the typed seeders) go through the same code as
    the API (resource versions, watch events, defaults), may set ``.status`` directly, and
    create a missing namespace. Everything returned is a deep copy.
    """

    def __init__(
        self, emulator: ApiServerEmulator, url: str, kubeconfig_path: Path, token: str
    ) -> None:
        self.emulator = emulator
        self.url = url
        self.kubeconfig_path = kubeconfig_path
        self.token = token

    # ---- clients ---------------------------------------------------------------------------

    def configuration(self) -> kubernetes.client.Configuration:
        """A fresh client Configuration loaded from the kubeconfig (the global one is untouched)."""
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig_path),
            client_configuration=configuration,
            persist_config=False,
        )
        return configuration

    def api_client(self) -> kubernetes.client.ApiClient:
        """A new ApiClient for this server; close it (or use it as a context manager)."""
        return kubernetes.client.ApiClient(configuration=self.configuration())

    def connection_info(self) -> kopf.ConnectionInfo:
        """Credentials for kopf's login (``@kopf.on.login`` handlers return these)."""
        return kopf.ConnectionInfo(
            server=self.url,
            scheme="Bearer",
            token=self.token,
            default_namespace="default",
            priority=1_000_000,  # above any other login handler's
        )

    # ---- generic access ------------------------------------------------------------------

    def create(self, body: Mapping[str, Any]) -> Body:
        """Create any served object, found by its apiVersion and kind."""
        rdef = self.emulator.resolve_kind(body["apiVersion"], body["kind"])
        namespace = _get_path(body, ("metadata", "namespace"))
        return self.emulator.create_object(rdef, namespace, body, privileged=True)

    def find(self, resource: ResourceRef, namespace: str | None, name: str) -> Body | None:
        return self.emulator.find_object(self.emulator.resolve(resource), namespace, name)

    def get(self, resource: ResourceRef, namespace: str | None, name: str) -> Body:
        obj = self.find(resource, namespace, name)
        if obj is None:
            raise KeyError(f"{resource} {namespace}/{name} does not exist")
        return obj

    def list_objects(self, resource: ResourceRef, namespace: str | None = None) -> list[Body]:
        return self.emulator.list_objects(self.emulator.resolve(resource), namespace)

    def patch(
        self, resource: ResourceRef, namespace: str | None, name: str, patch: Mapping[str, Any]
    ) -> Body:
        """JSON-merge-patch an object, ``.status`` included (as a controller would set it)."""
        return self.emulator.update_object(
            self.emulator.resolve(resource),
            namespace,
            name,
            lambda old: merge_patch(old, patch),
            privileged=True,
        )

    def delete(self, resource: ResourceRef, namespace: str | None, name: str) -> Body:
        """Delete as the API does (marked for deletion while finalizers remain)."""
        return self.emulator.delete_object(self.emulator.resolve(resource), namespace, name)

    # ---- typed seeders ---------------------------------------------------------------------

    def namespace(self, name: str, *, labels: Mapping[str, str] | None = None) -> Body:
        """Create a namespace, or return it if it exists."""
        if (existing := self.find(NAMESPACES, None, name)) is not None:
            return existing
        meta: Body = {"name": name, "labels": dict(labels or {})}
        return self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": meta})

    def secret(
        self,
        namespace: str,
        name: str,
        *,
        string_data: Mapping[str, str] | None = None,
        data: Mapping[str, bytes] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Body:
        encoded = {k: base64.b64encode(v).decode() for k, v in (data or {}).items()}
        return self.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": _meta(namespace, name, labels),
                "type": "Opaque",
                "data": encoded,
                "stringData": dict(string_data or {}),
            }
        )

    def deployment(
        self,
        namespace: str,
        name: str,
        *,
        replicas: int = 1,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        status: Mapping[str, Any] | None = None,
    ) -> Body:
        """A valid Deployment; its status says it has settled at ``replicas`` unless given."""
        pod_labels = dict(labels or {"app": name})
        settled = {
            "observedGeneration": 1,
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
        }
        container = {"name": "worker", "image": "venturi-worker:test"}
        meta = _meta(namespace, name, pod_labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        return self.create(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": meta,
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": pod_labels},
                    "template": {
                        "metadata": {"labels": pod_labels},
                        "spec": {"containers": [container]},
                    },
                },
                "status": dict(status) if status is not None else settled,
            }
        )

    def pod(
        self,
        namespace: str,
        name: str,
        *,
        labels: Mapping[str, str],
        annotations: Mapping[str, str] | None = None,
        phase: str = "Running",
    ) -> Body:
        """A pod as a ReplicaSet would make it (the harness runs no ReplicaSet controller)."""
        meta = _meta(namespace, name, labels)
        meta["annotations"] = dict(annotations or {})
        return self.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": meta,
                "spec": {"containers": [{"name": "worker", "image": "venturi-worker:test"}]},
                "status": {"phase": phase},
            }
        )

    def hpa(
        self,
        namespace: str,
        name: str,
        *,
        target: str,
        min_replicas: int = 1,
        max_replicas: int = 10,
        metrics: Sequence[Mapping[str, Any]] = (),
    ) -> Body:
        """An autoscaling/v2 HorizontalPodAutoscaler of the Deployment named ``target``."""
        target_ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": target}
        return self.create(
            {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": _meta(namespace, name, None),
                "spec": {
                    "scaleTargetRef": target_ref,
                    "minReplicas": min_replicas,
                    "maxReplicas": max_replicas,
                    "metrics": [dict(metric) for metric in metrics],
                },
            }
        )

    def jobqueue(
        self,
        namespace: str,
        name: str,
        spec: Mapping[str, Any],
        *,
        status: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Body:
        """A venturi.dev/v1alpha1 JobQueue (the CRD's defaults are applied to ``spec``)."""
        body: Body = {
            "apiVersion": "venturi.dev/v1alpha1",
            "kind": "JobQueue",
            "metadata": _meta(namespace, name, labels),
            "spec": copy.deepcopy(dict(spec)),
        }
        if status is not None:
            body["status"] = copy.deepcopy(dict(status))
        return self.create(body)

    def events(self, namespace: str | None = None, *, involved: str | None = None) -> list[Body]:
        """Core v1 Events posted so far (optionally only those about the object ``involved``)."""
        return [
            event
            for event in self.list_objects(EVENTS, namespace)
            if involved is None or _get_path(event, ("involvedObject", "name")) == involved
        ]

    # ---- waiting ---------------------------------------------------------------------------

    async def wait_until(
        self, condition: Callable[[], T | None], *, timeout: float = DEFAULT_TIMEOUT, what: str = ""
    ) -> T:
        """Await a truthy ``condition()``, re-checked after every write and watch start/end."""
        return await self.emulator.wait_until(condition, timeout=timeout, what=what)

    async def wait_for(
        self,
        resource: ResourceRef,
        namespace: str | None,
        name: str,
        predicate: Callable[[Body], object],
        *,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Body:
        """Await the object's existence and ``predicate(object)``; return that state."""

        def check() -> Body | None:
            obj = self.find(resource, namespace, name)
            return obj if obj is not None and predicate(obj) else None

        try:
            return await self.wait_until(check, timeout=timeout, what=f"{resource} {name}")
        except TimeoutError as e:
            raise TimeoutError(f"{e}; last state: {self.find(resource, namespace, name)}") from None

    async def wait_watching(
        self, resource: ResourceRef, *, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """Await a watch stream of ``resource`` being served (e.g. kopf has started watching)."""
        await self.wait_until(
            lambda: self.emulator.open_watches(resource) > 0,
            timeout=timeout,
            what=f"a watch of {resource}",
        )

    def open_watches(self, resource: ResourceRef | None = None) -> int:
        return self.emulator.open_watches(resource)

    @property
    def server_errors(self) -> list[Exception]:
        """Failures of the emulator itself (not API errors such as 404 or 409) so far."""
        return [e for e in self.emulator.errors if not isinstance(e, kmock.KubernetesError)]

    def expire_watch_history(self) -> None:
        """From now on, watches from older resource versions get 410 Gone (as after compaction)."""
        self.emulator.expire_watch_history()

    @property
    def revision(self) -> int:
        return self.emulator.revision


def _meta(namespace: str, name: str, labels: Mapping[str, str] | None) -> Body:
    meta: Body = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    return meta


def _kubeconfig(url: str, token: str) -> Body:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kube-harness", "cluster": {"server": url}}],
        "users": [{"name": "kube-harness", "user": {"token": token}}],
        "contexts": [
            {
                "name": "kube-harness",
                "context": {
                    "cluster": "kube-harness",
                    "user": "kube-harness",
                    "namespace": "default",
                },
            }
        ],
        "current-context": "kube-harness",
    }


@contextlib.asynccontextmanager
async def kube_harness(
    *,
    crds: Iterable[Path | Mapping[str, Any]] = (JOBQUEUE_CRD_PATH,),
    resources: Iterable[ResourceDef] = BUILTIN_RESOURCES,
    namespaces: Iterable[str] = ("default", "kube-system"),
    directory: Path | None = None,
) -> AsyncIterator[KubeHarness]:
    """Serve an emulated Kubernetes API on 127.0.0.1 (a free port) for the duration.

    ``crds`` are manifests (paths or dicts) whose resources are served and whose CRD objects
    are stored; ``namespaces`` exist from the start; the kubeconfig goes into ``directory``
    (a temporary directory by default, removed afterwards). On exit, watch streams are ended
    and the server stops; stop operators (:func:`run_operator`) before that.
    """
    emulator = ApiServerEmulator()
    for rdef in resources:
        emulator.define(rdef)
    for crd in crds:
        emulator.install_crd(load_crd(crd) if isinstance(crd, Path) else crd)
    for namespace in namespaces:
        emulator.create_object(
            emulator.resolve(NAMESPACES), None, {"metadata": {"name": namespace}}, privileged=True
        )
    own_directory = directory is None
    workdir = Path(tempfile.mkdtemp(prefix="kube-harness-")) if directory is None else directory
    try:
        async with emulator, kmock.Server(emulator, host="127.0.0.1") as server:
            url = str(server.url).rstrip("/")
            token = secrets.token_hex(16)
            kubeconfig_path = workdir / "kubeconfig"
            kubeconfig_path.write_text(json.dumps(_kubeconfig(url, token), indent=2) + "\n")
            harness = KubeHarness(emulator, url, kubeconfig_path, token)
            try:
                yield harness
            finally:
                emulator.close_watches()
                await emulator.wait_until(
                    lambda: emulator.open_watches() == 0, what="watch streams to end"
                )
            if errors := harness.server_errors:
                raise ExceptionGroup("the emulator failed while serving requests", errors)
    finally:
        if own_directory:
            shutil.rmtree(workdir, ignore_errors=True)


async def kube_fixture() -> AsyncIterator[KubeHarness]:
    """The harness as a pytest fixture: ``kube = pytest.fixture(kube_fixture, name="kube")``."""
    async with kube_harness() as harness:
        yield harness


# --------------------------------------------------------------------------------------------
# kopf, in a thread of its own
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _LoginTarget:
    info: kopf.ConnectionInfo | None = None


_login_targets: weakref.WeakKeyDictionary[kopf.OperatorRegistry, _LoginTarget] = (
    weakref.WeakKeyDictionary()
)
_login_lock = threading.Lock()


def _login_target(registry: kopf.OperatorRegistry) -> _LoginTarget:
    """Add (once per registry) a login handler that returns the current harness's credentials."""
    with _login_lock:
        target = _login_targets.get(registry)
        if target is None:
            target = _login_targets[registry] = _LoginTarget()
            bound = target

            @kopf.on.login(registry=registry, id="kube_harness")
            async def login(**_: Any) -> kopf.ConnectionInfo | None:
                return bound.info

        return target


def operator_settings() -> kopf.OperatorSettings:
    """kopf's settings for tests: quick reconnects, and never a SIGKILL on a slow exit."""
    settings = kopf.OperatorSettings()
    settings.watching.reconnect_backoff = 0.1
    return settings


class OperatorRun:
    """kopf's ``operator()`` running in a thread with an event loop of its own.

    Handlers run in that loop: to talk to the test, go through the API (and await it with
    :meth:`KubeHarness.wait_for`) or use thread-safe primitives.

    Stop kopf once it has settled: await the final state you expect, kopf's own writes
    included (e.g. its finalizer). kopf retries a write that lost a race on its next cycle,
    and if it is stopped in between, it can respawn a daemon during its shutdown and then
    wait 5 seconds (hard-coded) for that "hung" task before it cancels it.
    """

    def __init__(
        self,
        *,
        registry: kopf.OperatorRegistry,
        settings: kopf.OperatorSettings,
        namespaces: Sequence[str],
        memo: object | None,
    ) -> None:
        self.registry = registry
        self.settings = settings
        self.namespaces = tuple(namespaces)
        self.memo = memo
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._thread_main, name="kopf-operator", daemon=True)
        self._caller_loop: asyncio.AbstractEventLoop | None = None
        self._launched = asyncio.Event()
        self._ready = asyncio.Event()
        self._finished = asyncio.Event()
        self._request_stop: Callable[[], None] | None = None

    @property
    def running(self) -> bool:
        return self.thread.is_alive() and not self._finished.is_set()

    async def start(self, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Start kopf and await its readiness (startup handlers done, watching begins)."""
        self._caller_loop = asyncio.get_running_loop()
        self.thread.start()
        ready = asyncio.create_task(self._ready.wait())
        finished = asyncio.create_task(self._finished.wait())
        try:
            await asyncio.wait(
                {ready, finished}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (ready, finished):
                task.cancel()
            await asyncio.gather(ready, finished, return_exceptions=True)
        if self._finished.is_set():
            await self._join()
            raise RuntimeError("kopf exited before it was ready") from self.error
        if not self._ready.is_set():
            await self.stop(timeout=timeout)
            raise TimeoutError(f"kopf was not ready within {timeout}s")

    async def stop(self, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Raise kopf's stop-flag, await its exit, and re-raise what it failed with, if anything."""
        if not self._finished.is_set():
            async with asyncio.timeout(timeout):
                await self._launched.wait()
            assert self._request_stop is not None  # set before _launched
            with contextlib.suppress(RuntimeError):  # its loop is closed: it has exited already
                self._request_stop()
            try:
                async with asyncio.timeout(timeout):
                    await self._finished.wait()
            except TimeoutError:
                raise TimeoutError(f"kopf did not stop within {timeout}s") from None
        await self._join()
        if self.error is not None:
            raise self.error

    async def _join(self) -> None:
        await asyncio.to_thread(self.thread.join)

    def _signal(self, event: asyncio.Event) -> None:
        assert self._caller_loop is not None
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: no one listens
            self._caller_loop.call_soon_threadsafe(event.set)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._operate())
        except BaseException as e:
            self.error = e
        finally:
            self._signal(self._finished)

    async def _operate(self) -> None:
        loop = asyncio.get_running_loop()
        stop_flag = asyncio.Event()
        ready_flag: asyncio.Future[None] = loop.create_future()
        ready_flag.add_done_callback(lambda _: self._signal(self._ready))

        def request_stop() -> None:
            loop.call_soon_threadsafe(stop_flag.set)

        self._request_stop = request_stop
        self._signal(self._launched)
        await kopf.operator(
            registry=self.registry,
            settings=self.settings,
            standalone=True,
            clusterwide=not self.namespaces,
            namespaces=self.namespaces,
            memo=self.memo,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )


@contextlib.asynccontextmanager
async def run_operator(
    harness: KubeHarness,
    registry: kopf.OperatorRegistry,
    *,
    namespaces: Sequence[str] = (),
    settings: kopf.OperatorSettings | None = None,
    memo: object | None = None,
    startup_timeout: float = DEFAULT_TIMEOUT,
    stop_timeout: float = DEFAULT_TIMEOUT,
) -> AsyncIterator[OperatorRun]:
    """Run kopf with ``registry`` against the harness: standalone (no peering), cluster-wide
    unless ``namespaces`` are given, logged in with the harness's credentials.

    The registry gets one login handler (``kube_harness``) on first use; it returns nothing
    when no harness run uses the registry. On exit, kopf is stopped and awaited, and whatever
    it failed with is raised. ``settings`` default to :func:`operator_settings`; kopf's
    ultimate SIGKILL timeout is always disabled.
    """
    settings = settings if settings is not None else operator_settings()
    settings.process.ultimate_exiting_timeout = None
    target = _login_target(registry)
    if target.info is not None:
        raise RuntimeError("this registry is already running against a harness")
    target.info = harness.connection_info()
    run = OperatorRun(registry=registry, settings=settings, namespaces=namespaces, memo=memo)
    try:
        await run.start(timeout=startup_timeout)
        try:
            yield run
        finally:
            await run.stop(timeout=stop_timeout)
    finally:
        target.info = None
