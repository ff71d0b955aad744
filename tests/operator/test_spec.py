"""Parsing JobQueue specs, splitting stats per pool, and the CRD that both must agree with.

The CRD tests read crds/venturi.dev_jobqueues.yaml and derive their cases from it: every default,
bound, enum, pattern and list size the schema declares is checked against spec.py, so the two
cannot drift apart silently. CEL rules cannot run here (no API server); each one is paired with
a spec that breaks it, which spec.py must refuse.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from venturi_operator import policy
from venturi_operator.serving import Coverage, Registration
from venturi_operator.spec import (
    Behavior,
    DatabaseRef,
    JobQueueSpec,
    PolicyType,
    PoolLoad,
    PoolSpec,
    ScalingPolicy,
    ScalingRules,
    SelectPolicy,
    SpecError,
    parse_spec,
    pool_loads,
    unserved_by_pool,
    unserved_kinds,
)

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "venturi.dev_jobqueues.yaml"

Json = Any  # documents as YAML/JSON gives them: nested dicts, lists and scalars

MINIMAL: Json = {
    "database": {"secretName": "queue-db"},
    "pools": [{"deployment": "workers", "maxReplicas": 10, "targetPerReplica": 16}],
}

FULL: Json = {
    "database": {"secretName": "queue-db", "key": "url", "prefix": "billing_v2"},
    "interval": 30,
    "paused": True,
    "pools": [
        {
            "deployment": "mailers",
            "kinds": ["send_email", "send_sms"],
            "queues": ["default", "mail"],
            "minReplicas": 1,
            "maxReplicas": 20,
            "targetPerReplica": 8,
            "maxOldestPendingAge": 120,
            "activationThreshold": 3,
            "cooldownSeconds": 600,
            "fallbackReplicas": 1,
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 30,
                    "selectPolicy": "Min",
                    "tolerance": 0.05,
                    "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 600,
                    "selectPolicy": "Disabled",
                    "tolerance": 0.2,
                    "policies": [
                        {"type": "Percent", "value": 10, "periodSeconds": 60},
                        {"type": "Pods", "value": 1, "periodSeconds": 30},
                    ],
                },
            },
        },
        {"deployment": "general", "maxReplicas": 5, "targetPerReplica": 32},
    ],
}


def second_pool_like_the_first(kinds: list[str]) -> Json:
    """FULL with its second pool naming the first pool's queues and ``kinds``."""
    general = {**FULL["pools"][1], "queues": ["mail"], "kinds": kinds}
    return with_(FULL, "pools[1]", general)


def no_catch_all_filter(doc: Json, i: int) -> Json:
    """``doc`` with pool ``i``'s kinds and queues removed: a catch-all."""
    return without(without(doc, f"pools[{i}].kinds"), f"pools[{i}].queues")


def with_(doc: Json, path: str, value: Json) -> Json:
    """A copy of ``doc`` with the value at a CRD-style path (``pools[0].kinds``) replaced."""
    result = copy.deepcopy(doc)
    *parents, last = _steps(path)
    target = result
    for step in parents:
        target = target[step]
    target[last] = value
    return result


def without(doc: Json, path: str) -> Json:
    result = copy.deepcopy(doc)
    *parents, last = _steps(path)
    target = result
    for step in parents:
        target = target[step]
    del target[last]
    return result


def _steps(path: str) -> list[str | int]:
    steps: list[str | int] = []
    for part in path.split("."):
        name, *indices = re.split(r"\[(\d+)\]", part)
        if name:
            steps.append(name)
        steps.extend(int(i) for i in indices if i)
    return steps


# --- parsing -------------------------------------------------------------------------------------


def test_minimal_spec_takes_every_default() -> None:
    assert parse_spec(MINIMAL) == JobQueueSpec(
        database=DatabaseRef(secret_name="queue-db", key="dsn", prefix="venturi"),
        interval=15,
        paused=False,
        pools=(
            PoolSpec(
                deployment="workers",
                kinds=None,
                min_replicas=0,
                max_replicas=10,
                target_per_replica=16,
                max_oldest_pending_age=None,
                activation_threshold=0,
                cooldown_seconds=300,
                fallback_replicas=None,
                # No behavior: none of the user's limits (venturi's own rules apply).
                behavior=Behavior(scale_up=None, scale_down=None),
            ),
        ),
    )


def test_full_spec_keeps_every_value() -> None:
    spec = parse_spec(FULL)
    assert spec.database == DatabaseRef(secret_name="queue-db", key="url", prefix="billing_v2")
    assert (spec.interval, spec.paused) == (30, True)
    mailers, general = spec.pools
    assert mailers == PoolSpec(
        deployment="mailers",
        kinds=("send_email", "send_sms"),
        queues=("default", "mail"),
        min_replicas=1,
        max_replicas=20,
        target_per_replica=8,
        max_oldest_pending_age=120,
        activation_threshold=3,
        cooldown_seconds=600,
        fallback_replicas=1,
        behavior=Behavior(
            scale_up=ScalingRules(
                stabilization_window_seconds=30,
                policies=(ScalingPolicy(type=PolicyType.PODS, value=2, period_seconds=60),),
                select_policy=SelectPolicy.MIN,
                tolerance=0.05,
            ),
            scale_down=ScalingRules(
                stabilization_window_seconds=600,
                policies=(
                    ScalingPolicy(type=PolicyType.PERCENT, value=10, period_seconds=60),
                    ScalingPolicy(type=PolicyType.PODS, value=1, period_seconds=30),
                ),
                select_policy=SelectPolicy.DISABLED,
                tolerance=0.2,
            ),
        ),
    )
    assert general.kinds is None
    assert general.behavior == policy.DEFAULT_BEHAVIOR


def test_each_unset_behavior_field_takes_its_own_direction_default() -> None:
    doc = with_(
        MINIMAL,
        "pools[0].behavior",
        {"scaleUp": {"stabilizationWindowSeconds": 45}, "scaleDown": {"selectPolicy": "Min"}},
    )
    behavior = parse_spec(doc).pools[0].behavior
    assert behavior.scale_up is not None and behavior.scale_down is not None
    assert behavior.scale_up.stabilization_window_seconds == 45
    assert behavior.scale_up.policies == policy.DEFAULT_SCALE_UP.policies
    assert behavior.scale_down.select_policy is SelectPolicy.MIN
    assert behavior.scale_down.stabilization_window_seconds == 300
    assert behavior.scale_down.policies == policy.DEFAULT_SCALE_DOWN.policies


def test_null_values_count_as_absent() -> None:
    """The API server prunes nulls of non-nullable fields before defaulting; so does parsing."""
    doc = with_(with_(MINIMAL, "interval", None), "pools[0].behavior", None)
    assert parse_spec(doc) == parse_spec(MINIMAL)


# name, document, offending field
BAD_SPECS = [
    ("not an object", [], "spec"),
    ("database missing", without(MINIMAL, "database"), "spec.database"),
    ("pools missing", without(MINIMAL, "pools"), "spec.pools"),
    ("unknown field", with_(MINIMAL, "replicas", 3), "spec.replicas"),
    ("unknown pool field", with_(MINIMAL, "pools[0].minReplica", 1), "spec.pools[0].minReplica"),
    ("secretName missing", with_(MINIMAL, "database", {}), "spec.database.secretName"),
    ("secretName a number", with_(MINIMAL, "database.secretName", 5), "spec.database.secretName"),
    (
        "secretName uppercase",
        with_(MINIMAL, "database.secretName", "DB"),
        "spec.database.secretName",
    ),
    ("prefix with a dash", with_(MINIMAL, "database.prefix", "my-q"), "spec.database.prefix"),
    ("interval a string", with_(MINIMAL, "interval", "15"), "spec.interval"),
    ("interval a boolean", with_(MINIMAL, "interval", True), "spec.interval"),
    ("interval a fraction", with_(MINIMAL, "interval", 1.5), "spec.interval"),
    ("paused a string", with_(MINIMAL, "paused", "yes"), "spec.paused"),
    ("pools an object", with_(MINIMAL, "pools", {"deployment": "w"}), "spec.pools"),
    ("pools empty", with_(MINIMAL, "pools", []), "spec.pools"),
    ("pool a string", with_(MINIMAL, "pools[0]", "workers"), "spec.pools[0]"),
    ("deployment missing", without(MINIMAL, "pools[0].deployment"), "spec.pools[0].deployment"),
    ("maxReplicas missing", without(MINIMAL, "pools[0].maxReplicas"), "spec.pools[0].maxReplicas"),
    (
        "targetPerReplica missing",
        without(MINIMAL, "pools[0].targetPerReplica"),
        "spec.pools[0].targetPerReplica",
    ),
    ("kinds a string", with_(MINIMAL, "pools[0].kinds", "send_email"), "spec.pools[0].kinds"),
    ("kinds empty", with_(MINIMAL, "pools[0].kinds", []), "spec.pools[0].kinds"),
    ("kind a number", with_(MINIMAL, "pools[0].kinds", [1]), "spec.pools[0].kinds[0]"),
    ("kind with a space", with_(MINIMAL, "pools[0].kinds", ["a b"]), "spec.pools[0].kinds[0]"),
    (
        "kind listed twice",
        with_(MINIMAL, "pools[0].kinds", ["a", "b", "a"]),
        "spec.pools[0].kinds[2]",
    ),
    (
        "minReplicas above maxReplicas",
        with_(MINIMAL, "pools[0].minReplicas", 11),
        "spec.pools[0].minReplicas",
    ),
    (
        "fallbackReplicas above maxReplicas",
        with_(MINIMAL, "pools[0].fallbackReplicas", 11),
        "spec.pools[0].fallbackReplicas",
    ),
    (
        "deployment listed twice",
        with_(FULL, "pools[1].deployment", "mailers"),
        "spec.pools[1].deployment",
    ),
    ("kind in two pools", second_pool_like_the_first(["send_sms"]), "spec.pools[1].kinds[0]"),
    ("two catch-all pools", no_catch_all_filter(FULL, 0), "spec.pools[1].kinds"),
    (
        "queue in two pools without kinds",
        with_(without(FULL, "pools[0].kinds"), "pools[1].queues", ["mail"]),
        "spec.pools[1].queues[0]",
    ),
    (
        "kind in two pools without queues",
        with_(without(FULL, "pools[0].queues"), "pools[1].kinds", ["send_email"]),
        "spec.pools[1].kinds[0]",
    ),
    ("queues a string", with_(MINIMAL, "pools[0].queues", "high"), "spec.pools[0].queues"),
    ("queues empty", with_(MINIMAL, "pools[0].queues", []), "spec.pools[0].queues"),
    ("queue with a space", with_(MINIMAL, "pools[0].queues", ["a b"]), "spec.pools[0].queues[0]"),
    (
        "queue listed twice",
        with_(MINIMAL, "pools[0].queues", ["a", "a"]),
        "spec.pools[0].queues[1]",
    ),
    (
        "selectPolicy in lower case",
        with_(FULL, "pools[0].behavior.scaleUp.selectPolicy", "max"),
        "spec.pools[0].behavior.scaleUp.selectPolicy",
    ),
    (
        "policy type in lower case",
        with_(FULL, "pools[0].behavior.scaleUp.policies[0].type", "pods"),
        "spec.pools[0].behavior.scaleUp.policies[0].type",
    ),
    (
        "policy without period",
        without(FULL, "pools[0].behavior.scaleUp.policies[0].periodSeconds"),
        "spec.pools[0].behavior.scaleUp.policies[0].periodSeconds",
    ),
    (
        "policies empty",
        with_(FULL, "pools[0].behavior.scaleDown.policies", []),
        "spec.pools[0].behavior.scaleDown.policies",
    ),
    (
        "behavior misspelt",
        with_(MINIMAL, "pools[0].behavior", {"scaleup": {}}),
        "spec.pools[0].behavior.scaleup",
    ),
    (
        "tolerance as a percentage",
        with_(FULL, "pools[0].behavior.scaleUp.tolerance", "10%"),
        "spec.pools[0].behavior.scaleUp.tolerance",
    ),
]


@pytest.mark.parametrize(("doc", "path"), [pytest.param(*c[1:], id=c[0]) for c in BAD_SPECS])
def test_bad_specs_name_the_field(doc: Json, path: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(doc)
    assert caught.value.field == path
    assert str(caught.value).startswith(f"{path}: ")
    assert isinstance(caught.value, ValueError)


def test_direct_construction_is_checked_too() -> None:
    with pytest.raises(SpecError, match=r"^deployment: ") as caught:
        PoolSpec(deployment="Workers", max_replicas=1, target_per_replica=1)
    assert caught.value.field == "deployment"


def test_pool_for_prefers_a_named_pool_over_the_catch_all() -> None:
    spec = parse_spec(FULL)
    assert spec.pool_for("send_sms") is spec.pools[0]
    assert spec.pool_for("anything_else") is spec.pools[1]
    assert parse_spec(with_(FULL, "pools", FULL["pools"][:1])).pool_for("other") is None


# --- stats per pool ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kinds:
    """Shaped like the runtime's venturi.QueueStats (which this package must not import)."""

    pending_by_kind: Mapping[str, int] = field(default_factory=dict)
    claimed_by_kind: Mapping[str, int] = field(default_factory=dict)
    oldest_pending_age_by_kind: Mapping[str, float] = field(default_factory=dict)
    dead_by_kind: Mapping[str, int] = field(default_factory=dict)
    completed_by_kind: Mapping[str, int] = field(default_factory=dict)
    paused: bool = False


@dataclass(frozen=True)
class Stats(Kinds):
    """Shaped like the runtime's venturi.Stats: totals, and the same per queue."""

    queues: Mapping[str, Kinds] = field(default_factory=dict)


def in_queues(by_queue: Mapping[str, Kinds]) -> Stats:
    """Stats holding ``by_queue`` (the totals are not what pool_loads reads)."""
    return Stats(queues=by_queue)


STATS = in_queues(
    {
        "default": Kinds(
            pending_by_kind={"send_email": 3, "send_sms": 2, "report": 0, "reindex": 7, "other": 1},
            claimed_by_kind={"send_email": 1, "report": 2, "reindex": 1},
            oldest_pending_age_by_kind={
                "send_email": 12.5,
                "send_sms": 40.0,
                "report": 99.0,  # nothing pending: a stale age must not count
                "reindex": 5.0,
                "other": -0.2,  # database time a hair ahead of run_at
            },
            dead_by_kind={"send_email": 4},
            completed_by_kind={"send_email": 100, "send_sms": 20, "archive": 7},
        )
    }
)

THREE_POOLS: Json = {
    "database": {"secretName": "queue-db"},
    "pools": [
        {
            "deployment": "mailers",
            "kinds": ["send_email", "send_sms"],
            "maxReplicas": 5,
            "targetPerReplica": 1,
        },
        {"deployment": "reports", "kinds": ["report"], "maxReplicas": 5, "targetPerReplica": 1},
        {"deployment": "rest", "maxReplicas": 5, "targetPerReplica": 1},
    ],
}


def test_pool_loads_sum_each_pools_kinds_and_the_catch_all_takes_the_rest() -> None:
    loads = pool_loads(parse_spec(THREE_POOLS), STATS)
    assert list(loads) == ["mailers", "reports", "rest"]
    # Finished totals (completed + dead) too: the difference between ticks is completions.
    assert loads["mailers"] == PoolLoad(
        pending=5, claimed=1, oldest_pending_age=40.0, finished=100 + 4 + 20
    )
    assert loads["reports"] == PoolLoad(pending=0, claimed=2, oldest_pending_age=None, finished=0)
    assert loads["rest"] == PoolLoad(pending=8, claimed=1, oldest_pending_age=5.0, finished=7)


def test_without_a_catch_all_other_kinds_are_unserved() -> None:
    spec = parse_spec(with_(THREE_POOLS, "pools", THREE_POOLS["pools"][:2]))
    loads = pool_loads(spec, STATS)
    assert list(loads) == ["mailers", "reports"]
    assert unserved_kinds(spec, STATS) == {"reindex", "other"}
    assert unserved_kinds(parse_spec(THREE_POOLS), STATS) == frozenset()


BY_QUEUE: Json = {
    "database": {"secretName": "queue-db"},
    "pools": [
        {"deployment": "urgent", "queues": ["high"], "maxReplicas": 5, "targetPerReplica": 1},
        {
            "deployment": "urgent-mail",
            "queues": ["high"],
            "kinds": ["send_email"],
            "maxReplicas": 5,
            "targetPerReplica": 1,
        },
        {"deployment": "mailers", "kinds": ["send_email"], "maxReplicas": 5, "targetPerReplica": 1},
        {"deployment": "rest", "maxReplicas": 5, "targetPerReplica": 1},
    ],
}


def test_pool_for_takes_the_most_specific_pool_queue_first() -> None:
    spec = parse_spec(BY_QUEUE)
    urgent, urgent_mail, mailers, rest = spec.pools
    assert spec.pool_for("send_email", "high") is urgent_mail  # its queue and its kind
    assert spec.pool_for("report", "high") is urgent  # its queue, every kind of it
    assert spec.pool_for("send_email", "default") is mailers  # its kind, in every queue
    assert spec.pool_for("send_email", "bulk") is mailers
    assert spec.pool_for("report", "bulk") is rest  # the catch-all
    assert spec.pool_for("report") is rest  # the default queue
    # Pools of different precedence may overlap; pools of the same may not.
    same = with_(BY_QUEUE, "pools[2].queues", ["high", "bulk"])
    with pytest.raises(
        SpecError, match=r"pools\[2\]\.kinds\[0\]: kind 'send_email' of queue 'high'"
    ):
        parse_spec(same)


def test_pool_loads_sum_the_kinds_of_each_pools_queues() -> None:
    stats = in_queues(
        {
            "high": Kinds(
                pending_by_kind={"send_email": 2, "report": 3},
                claimed_by_kind={"report": 1},
                oldest_pending_age_by_kind={"send_email": 9.0, "report": 4.0},
                completed_by_kind={"report": 10},
            ),
            "default": Kinds(
                pending_by_kind={"send_email": 5, "report": 1},
                claimed_by_kind={"send_email": 2},
                oldest_pending_age_by_kind={"send_email": 30.0, "report": 60.0},
                dead_by_kind={"send_email": 1},
            ),
            "bulk": Kinds(
                pending_by_kind={"send_email": 4, "report": 6},
                oldest_pending_age_by_kind={"send_email": 500.0, "report": 700.0},
                paused=True,  # waiting, but no demand (and its age says nothing)
            ),
        }
    )
    loads = pool_loads(parse_spec(BY_QUEUE), stats)
    assert loads == {
        "urgent": PoolLoad(pending=3, claimed=1, oldest_pending_age=4.0, finished=10),
        "urgent-mail": PoolLoad(pending=2, claimed=0, oldest_pending_age=9.0, finished=0),
        "mailers": PoolLoad(pending=9, claimed=2, oldest_pending_age=30.0, finished=1, paused=4),
        "rest": PoolLoad(pending=7, claimed=0, oldest_pending_age=60.0, finished=0, paused=6),
    }
    only_high = parse_spec(with_(BY_QUEUE, "pools", BY_QUEUE["pools"][:2]))
    assert unserved_kinds(only_high, stats) == {"send_email", "report"}
    assert unserved_kinds(parse_spec(with_(BY_QUEUE, "pools", BY_QUEUE["pools"][:3])), stats) == {
        "report"
    }


def test_empty_stats_give_empty_loads() -> None:
    loads = pool_loads(parse_spec(THREE_POOLS), Stats())
    assert set(loads.values()) == {
        PoolLoad(pending=0, claimed=0, oldest_pending_age=None, finished=0)
    }


# --- the CRD -------------------------------------------------------------------------------------


def load_crd() -> Json:
    with CRD_PATH.open() as f:
        return yaml.safe_load(f)


def version() -> Json:
    (only,) = load_crd()["spec"]["versions"]
    return only


def root_schema() -> Json:
    return version()["schema"]["openAPIV3Schema"]


def spec_schema() -> Json:
    return root_schema()["properties"]["spec"]


def apply_defaults(schema: Json, doc: Json) -> Json:
    """The API server's structural defaulting: absent fields take their default, recursively."""
    doc = copy.deepcopy(doc)
    _default(schema, doc)
    return doc


def _default(schema: Json, value: Json) -> None:
    properties = schema.get("properties", {})
    if isinstance(value, dict):
        for key, prop in properties.items():
            if key not in value and "default" in prop:
                value[key] = copy.deepcopy(prop["default"])
        for key, item in value.items():
            if key in properties:
                _default(properties[key], item)
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            _default(schema["items"], item)


def nodes(schema: Json, path: str = "spec") -> Iterator[tuple[str, Json]]:
    """Every schema node under ``schema`` with its CRD path; list items take index 0."""
    yield path, schema
    for key, prop in schema.get("properties", {}).items():
        yield from nodes(prop, f"{path}.{key}")
    if "items" in schema:
        yield from nodes(schema["items"], f"{path}[0]")


def without_prefix(path: str) -> str:
    return path.removeprefix("spec.")


def test_crd_is_a_v1_crd_for_jobqueues() -> None:
    crd = load_crd()
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    spec = crd["spec"]
    names = spec["names"]
    assert (
        crd["metadata"]["name"] == f"{names['plural']}.{spec['group']}" == "jobqueues.venturi.dev"
    )
    assert (names["kind"], names["listKind"], names["singular"]) == (
        "JobQueue",
        "JobQueueList",
        "jobqueue",
    )
    assert "jq" in names["shortNames"]
    assert "venturi" in names["categories"]
    assert "all" not in names["categories"]  # `kubectl delete all` must not take JobQueues
    assert spec["scope"] == "Namespaced"
    assert [(v["name"], v["served"], v["storage"]) for v in spec["versions"]] == [
        ("v1alpha1", True, True)
    ]
    assert version()["subresources"] == {"status": {}}


def test_status_keeps_what_kopf_writes_and_spec_is_strict() -> None:
    root = root_schema()
    assert root["type"] == "object"
    assert root["properties"]["status"]["x-kubernetes-preserve-unknown-fields"] is True
    assert not any(
        node.get("x-kubernetes-preserve-unknown-fields") for _, node in nodes(spec_schema())
    )


def test_schema_is_structural() -> None:
    """The rules the API server enforces on structural schemas, the ones a typo breaks."""
    for path, node in nodes(root_schema(), "root"):
        if path == "root.metadata":
            assert node == {"type": "object"}, "metadata may only say it is an object"
            continue
        assert "type" in node, path
        if node["type"] == "array":
            assert "items" in node, path
        for name in node.get("required", []):
            assert name in node.get("properties", {}), f"{path}: required {name} is not defined"
        if node.get("x-kubernetes-list-type") == "map":
            items = node["items"]
            for key in node["x-kubernetes-list-map-keys"]:
                assert key in items.get("required", []), f"{path}: map key {key} not required"
        if node.get("x-kubernetes-list-type") == "set":
            assert node["items"]["type"] in ("string", "integer", "number", "boolean"), path
        if "default" in node:
            _assert_valid(node, node["default"], f"default of {path}")


def test_duplicates_spec_py_refuses_are_refused_by_the_crds_list_types() -> None:
    """A deployment in two pools, or a kind twice in a pool: spec.py refuses both, and so does
    the API server, through the list types (jsonschema here ignores them; e2e test_05 applies
    both to a real API server and sees "Duplicate value")."""
    pools = spec_schema()["properties"]["pools"]
    assert pools["x-kubernetes-list-type"] == "map"
    assert pools["x-kubernetes-list-map-keys"] == ["deployment"]
    assert pools["items"]["properties"]["kinds"]["x-kubernetes-list-type"] == "set"
    twice = with_(FULL, "pools[1].deployment", "mailers")
    with pytest.raises(SpecError, match=r"pools\[1\]\.deployment: duplicate deployment"):
        parse_spec(twice)
    again = with_(FULL, "pools[0].kinds", ["send_email", "send_email"])
    with pytest.raises(SpecError, match=r"pools\[0\]\.kinds\[1\]: duplicate kind"):
        parse_spec(again)


def test_cel_rules_iterate_only_bounded_lists_and_strings() -> None:
    """The API server refuses CEL rules whose worst-case cost it cannot bound.

    The rules iterate the pools, each pool's kinds, and compare deployments and kinds; maxItems
    and maxLength on exactly those bound the cost (see MAX_POOLS in spec.py).
    """
    pools = spec_schema()["properties"]["pools"]
    item = pools["items"]["properties"]
    assert "maxItems" in pools
    assert "maxLength" in item["deployment"]
    assert "maxItems" in item["kinds"]
    assert "maxLength" in item["kinds"]["items"]
    rules = [
        rule
        for _, node in nodes(spec_schema())
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert len(rules) == 4
    assert all(rule["message"] for rule in rules)


def test_printer_columns_point_at_fields_of_the_schema() -> None:
    columns = version()["additionalPrinterColumns"]
    assert [c["name"] for c in columns if c.get("priority", 0) == 0] == [
        "Pending",
        "Claimed",
        "Oldest",
        "Replicas",
        "Ready",
        "Age",
    ]
    types = {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean"}
    for column in columns:
        if column["jsonPath"] == ".metadata.creationTimestamp":
            assert column["type"] == "date"
            continue
        node = root_schema()
        for part in re.sub(r"\[\?\(.*?\)\]", "[]", column["jsonPath"]).strip(".").split("."):
            node = node["properties"][part.removesuffix("[]")]
            if part.endswith("[]"):
                node = node["items"]
        assert types[node["type"]] == column["type"], column["name"]


# The CRD's defaults and spec.py's are one source of truth in spirit: parsing a spec as the user
# wrote it and as the API server defaults it must give the same value.
DEFAULTING_CASES = [
    ("minimal", MINIMAL),
    ("empty behavior", with_(MINIMAL, "pools[0].behavior", {})),
    ("empty directions", with_(MINIMAL, "pools[0].behavior", {"scaleUp": {}, "scaleDown": {}})),
    (
        "one field per direction",
        with_(
            MINIMAL,
            "pools[0].behavior",
            {"scaleUp": {"tolerance": 0.3}, "scaleDown": {"stabilizationWindowSeconds": 5}},
        ),
    ),
    (
        "only policies",
        with_(
            MINIMAL,
            "pools[0].behavior",
            {"scaleDown": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}},
        ),
    ),
    ("full", FULL),
]


@pytest.mark.parametrize("doc", [pytest.param(c[1], id=c[0]) for c in DEFAULTING_CASES])
def test_crd_defaults_match_spec_py(doc: Json) -> None:
    defaulted = apply_defaults(spec_schema(), doc)
    assert parse_spec(defaulted) == parse_spec(doc)


def test_fields_without_a_crd_default_are_none_in_spec_py() -> None:
    optional_without_default = set()
    for path, node in nodes(spec_schema()):
        for name, prop in node.get("properties", {}).items():
            if name not in node.get("required", []) and "default" not in prop:
                optional_without_default.add(f"{path}.{name}")
    assert optional_without_default == {
        "spec.pools[0].kinds",
        "spec.pools[0].queues",
        "spec.pools[0].maxOldestPendingAge",
        "spec.pools[0].fallbackReplicas",
        "spec.pools[0].behavior",
        "spec.pools[0].behavior.scaleUp",
        "spec.pools[0].behavior.scaleDown",
    }
    pool = parse_spec(MINIMAL).pools[0]
    assert (pool.kinds, pool.max_oldest_pending_age, pool.fallback_replicas) == (None, None, None)
    assert pool.queues is None
    assert (pool.behavior.scale_up, pool.behavior.scale_down) == (None, None)
    one_way = with_(MINIMAL, "pools[0].behavior", {"scaleUp": {}})
    behavior = parse_spec(one_way).pools[0].behavior
    assert (behavior.scale_up, behavior.scale_down) == (policy.DEFAULT_SCALE_UP, None)


def _leaves(key: str) -> list[tuple[str, Json]]:
    return [(path, node) for path, node in nodes(spec_schema()) if key in node]


@pytest.mark.parametrize(
    ("path", "bound", "step"),
    [
        pytest.param(path, node[key], step, id=f"{path} {key}")
        for key, step in (("minimum", -1), ("maximum", 1))
        for path, node in _leaves(key)
    ],
)
def test_numeric_bounds_match_spec_py(path: str, bound: int, step: int) -> None:
    parse_spec(with_(FULL, without_prefix(path), bound))
    with pytest.raises(SpecError) as caught:
        parse_spec(with_(FULL, without_prefix(path), bound + step))
    assert caught.value.field == path


def _items(path: str, count: int) -> list[Json]:
    """``count`` distinct valid items for the list at ``path``."""
    if path == "spec.pools":
        return [
            {
                "deployment": f"pool-{i}",
                "kinds": [f"kind_{i}"],
                "maxReplicas": 1,
                "targetPerReplica": 1,
            }
            for i in range(count)
        ]
    if path.endswith(".kinds"):
        return [f"kind_{i}" for i in range(count)]
    if path.endswith(".queues"):
        return [f"queue_{i}" for i in range(count)]
    if path.endswith(".policies"):
        return [{"type": "Pods", "value": i + 1, "periodSeconds": 15} for i in range(count)]
    raise AssertionError(f"no items known for {path}: teach _items about it")


@pytest.mark.parametrize(
    ("path", "size", "ok"),
    [
        pytest.param(path, size, ok, id=f"{path} {size}")
        for key, step in (("minItems", -1), ("maxItems", 1))
        for path, node in _leaves(key)
        for size, ok in ((node[key], True), (node[key] + step, False))
    ],
)
def test_list_sizes_match_spec_py(path: str, size: int, ok: bool) -> None:
    doc = with_(FULL, without_prefix(path), _items(path, size))
    if ok:
        parse_spec(doc)
    else:
        with pytest.raises(SpecError) as caught:
            parse_spec(doc)
        assert caught.value.field == path


@pytest.mark.parametrize(
    ("path", "values"), [pytest.param(p, n["enum"], id=p) for p, n in _leaves("enum")]
)
def test_enums_match_spec_py(path: str, values: list[str]) -> None:
    for value in values:
        parse_spec(with_(FULL, without_prefix(path), value))
    for value in ("bogus", values[0].lower(), values[0].upper()):
        with pytest.raises(SpecError) as caught:
            parse_spec(with_(FULL, without_prefix(path), value))
        assert caught.value.field == path


# fmt: off
CANDIDATE_STRINGS = [
    "a", "db", "queue-db", "my-db.prod", "1db", "venturi", "billing_v2", "send_email", "a/b:c.d-e",
    "Report.Monthly", "-db", "db-", "Db", "db_x", "db..x", ".db", "_x", "é", "a$", "ab-c", "",
    "x y", *("a" * n for n in (39, 40, 200, 201, 253, 254)),
]
# fmt: on


def _parses(doc: Json, path: str) -> bool:
    """Whether spec.py takes ``doc``; a refusal must blame ``path``."""
    try:
        parse_spec(doc)
    except SpecError as exc:
        if exc.field != path:
            raise
        return False
    return True


@pytest.mark.parametrize(
    "path", [p for p, n in nodes(spec_schema()) if n["type"] == "string" and "enum" not in n]
)
def test_string_rules_match_spec_py(path: str) -> None:
    node = dict(nodes(spec_schema()))[path]
    pattern = re.compile(node.get("pattern", ".*"))
    for candidate in CANDIDATE_STRINGS:
        crd_ok = (
            node.get("minLength", 0) <= len(candidate) <= node.get("maxLength", 10**9)
            and pattern.search(candidate) is not None
        )
        python_ok = _parses(with_(FULL, without_prefix(path), candidate), path)
        assert python_ok == crd_ok, f"{path} = {candidate!r}: CRD {crd_ok}, spec.py {python_ok}"


# Each CEL rule of the CRD, by message, with a spec that only CEL (not the OpenAPI schema) refuses.
CEL_EXAMPLES = {
    "minReplicas must be less than or equal to maxReplicas": with_(
        MINIMAL, "pools[0].minReplicas", 11
    ),
    "fallbackReplicas must be less than or equal to maxReplicas": with_(
        MINIMAL, "pools[0].fallbackReplicas", 11
    ),
    "at most one pool may omit both kinds and queues (the catch-all pool)": no_catch_all_filter(
        FULL, 0
    ),
    (
        "two pools that name the same fields (kinds, queues, or both) may not serve the same "
        "job: a kind (in a queue, when they name queues) or a queue (when they name no kinds) "
        "is named by one of them only"
    ): second_pool_like_the_first(["send_email"]),
}


def test_every_cel_rule_has_an_example_spec_py_refuses() -> None:
    messages = {
        rule["message"]
        for _, node in nodes(spec_schema())
        for rule in node.get("x-kubernetes-validations", [])
    }
    assert messages == set(CEL_EXAMPLES)
    for message, doc in CEL_EXAMPLES.items():
        _assert_valid(spec_schema(), doc, message)  # the OpenAPI part accepts it...
        with pytest.raises(SpecError):  # ...and spec.py, like the CEL rule, does not
            parse_spec(doc)


# jsonschema checks the OpenAPI part of the schema (types, bounds, enums, patterns, required);
# x-kubernetes-* keys and formats are ignored, as are CEL rules.
def _assert_valid(schema: Json, doc: Json, what: str) -> None:
    errors = list(jsonschema.Draft4Validator(schema).iter_errors(doc))
    assert not errors, f"{what}: {[e.message for e in errors]}"


@pytest.mark.parametrize("doc", [MINIMAL, FULL, apply_defaults(spec_schema(), FULL)])
def test_good_specs_validate_against_the_crd(doc: Json) -> None:
    _assert_valid(
        root_schema(),
        {
            "apiVersion": "venturi.dev/v1alpha1",
            "kind": "JobQueue",
            "metadata": {"name": "q"},
            "spec": doc,
        },
        "spec",
    )


def strict(schema: Json) -> Json:
    """The schema as kubectl's strict field validation applies it: unknown fields are errors."""
    schema = copy.deepcopy(schema)
    for _, node in nodes(schema):
        if "properties" in node:
            node["additionalProperties"] = False
    return schema


@pytest.mark.parametrize(("doc", "path"), [pytest.param(*c[1:], id=c[0]) for c in BAD_SPECS[1:]])
def test_what_spec_py_refuses_the_api_server_refuses(doc: Json, path: str) -> None:
    """spec.py is never stricter than the CRD: a JobQueue the API server took always parses."""
    if list(jsonschema.Draft4Validator(strict(spec_schema())).iter_errors(doc)):
        return
    assert _cel_would_refuse(doc), f"neither the schema nor a CEL rule refuses {path}"


def _cel_would_refuse(doc: Json) -> bool:
    """The CRD's four CEL rules, transcribed; see CEL_EXAMPLES for their link to the CRD."""
    pools = doc["pools"]
    catch_alls = [p for p in pools if "kinds" not in p and "queues" not in p]
    names = [p["deployment"] for p in pools]

    def overlap(p: Json, q: Json) -> bool:
        return all(
            (key in p) == (key in q) and (key not in p or bool(set(p[key]) & set(q[key])))
            for key in ("kinds", "queues")
        )

    return (
        any(p.get("minReplicas", 0) > p["maxReplicas"] for p in pools)
        or any(p.get("fallbackReplicas", 0) > p["maxReplicas"] for p in pools)
        or len(catch_alls) > 1
        or any(overlap(p, q) for i, p in enumerate(pools) for q in pools[:i])
        or len(set(names)) < len(names)  # the x-kubernetes-list-map-keys rule
        or any(
            len(set(p.get(key, []))) < len(p.get(key, []))
            for p in pools
            for key in ("kinds", "queues")
        )  # sets
    )


def test_a_status_as_the_operator_writes_it_validates() -> None:
    status = {
        "observedGeneration": 3,
        "replicas": 4,
        "desiredReplicas": 5,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": policy.Reason.BACKLOG_ABOVE_TARGET.value,
                "message": "12 outstanding jobs need 5 replicas",
                "lastTransitionTime": "2026-11-29T18:00:00Z",
                "observedGeneration": 3,
            }
        ],
        "stats": {
            "observedTime": "2026-11-29T18:00:00Z",
            "pending": 10,
            "claimed": 2,
            "oldestPendingAge": 4.5,
            "pendingByKind": {"send_email": 10},
            "claimedByKind": {"send_email": 2},
            "deadByKind": {},
            "oldestPendingAgeByKind": {"send_email": 4.5},
            "unservedKinds": [],
        },
        "pools": [
            {
                "deployment": "workers",
                "currentReplicas": 4,
                "desiredReplicas": 5,
                "recommendedReplicas": 5,
                "pending": 10,
                "claimed": 2,
                "oldestPendingAge": 4.5,
                "fallback": False,
                "reason": "BacklogAboveTarget",
                "message": "12 outstanding jobs need 5 replicas",
                "lastDecisionTime": "2026-11-29T18:00:00Z",
                "lastScaleTime": "2026-11-29T18:00:00Z",
            }
        ],
        "kopf": {"progress": {}},
    }
    _assert_valid(root_schema()["properties"]["status"], status, "status")


def test_jobs_of_kinds_a_pools_workers_do_not_serve_are_unserved_and_have_no_age() -> None:
    spec = parse_spec(THREE_POOLS)
    sms_only = Coverage(
        template="t",
        registrations=(Registration(pod="m-1", queues=("default",), kinds=("send_sms",)),),
    )
    coverage = {"mailers": sms_only, "reports": None}  # "rest": not given, nothing known
    loads = pool_loads(spec, STATS, coverage)
    # send_email (3 pending, 12.5 s old) is no worker's of the pool: pending, but unserved, and
    # only send_sms's age counts. Its claimed job still counts (someone holds it).
    assert loads["mailers"] == PoolLoad(
        pending=5, claimed=1, oldest_pending_age=40.0, finished=124, unserved=3
    )
    assert loads["rest"] == pool_loads(spec, STATS)["rest"]
    assert unserved_by_pool(spec, STATS, coverage) == {
        "mailers": {("default", "send_email")},
        "reports": frozenset(),
        "rest": frozenset(),
    }
    # The age of a served kind older than the unserved one's still counts.
    email_only = Coverage(
        template="t",
        registrations=(Registration(pod="m-1", queues=("default",), kinds=("send_email",)),),
    )
    assert pool_loads(spec, STATS, {"mailers": email_only})["mailers"] == PoolLoad(
        pending=5, claimed=1, oldest_pending_age=12.5, finished=124, unserved=2
    )
