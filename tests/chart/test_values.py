"""values.yaml documents every value (`# --`), and values.schema.json is strict and complete."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import yaml

from .rendering import CHART

VALUES_TEXT = (CHART / "values.yaml").read_text(encoding="utf-8")
VALUES = yaml.safe_load(VALUES_TEXT)
SCHEMA = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
KEY = re.compile(r"^(\s*)([A-Za-z0-9_.\-/]+):")
# Kubernetes objects passed through to the pod: the schema lists every field Kubernetes has,
# values.yaml only the defaults worth setting.
PASS_THROUGH = {
    "resources",
    "podSecurityContext",
    "securityContext",
    "affinity",
    "extraEnv",
    "tolerations",
    "imagePullSecrets",
    "nodeSelector",
    "podAnnotations",
}
# Free-form on purpose: a parent chart's globals, and the contents of affinity terms (Kubernetes
# types with deep structure of their own).
FREE = {
    "global",
    "requiredDuringSchedulingIgnoredDuringExecution",
    "preferredDuringSchedulingIgnoredDuringExecution",
}


def test_every_value_has_a_doc_comment() -> None:
    lines = VALUES_TEXT.splitlines()
    missing = []
    for number, line in enumerate(lines):
        match = KEY.match(line)
        if not match:
            continue
        indent, comment = match.group(1), []
        above = number - 1
        while above >= 0 and lines[above].startswith(indent + "#"):
            comment.append(lines[above].strip())
            above -= 1
        if not any(c.startswith("# --") for c in comment):
            missing.append(f"values.yaml:{number + 1}: {line.strip()}")
    assert not missing, "values without a `# --` comment:\n" + "\n".join(missing)


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}.*")
    for sub in schema.get("anyOf", []):
        yield from walk(sub, path)


def test_schema_rejects_unknown_keys_everywhere() -> None:
    for path, node in walk(SCHEMA):
        types = node.get("type")
        is_object = types == "object" or (isinstance(types, list) and "object" in types)
        if not is_object or any(part.removesuffix("[]") in FREE for part in path.split(".")):
            continue
        if "properties" in node:
            assert node.get("additionalProperties") is False, f"{path or '.'}: not strict"
        else:  # a map: its values are typed
            assert isinstance(node.get("additionalProperties"), dict), f"{path}: untyped map"


def test_schema_and_values_have_the_same_keys() -> None:
    def compare(values: dict[str, Any], schema: dict[str, Any], path: str) -> None:
        props = schema["properties"]
        extra = sorted(set(values) - set(props))
        assert not extra, f"{path}: {extra} in values.yaml but not in the schema"
        top = path.split(".")[1] if path else ""
        if top not in PASS_THROUGH:
            undocumented = sorted(set(props) - set(values) - {"global"})
            assert not undocumented, f"{path}: {undocumented} in the schema but not in values"
        for key, value in values.items():
            if isinstance(value, dict) and "properties" in props[key]:
                compare(value, props[key], f"{path}.{key}")

    compare(VALUES, SCHEMA, "")


def test_defaults_are_valid_against_the_schema_types() -> None:
    """A light check (helm lint validates fully): each default has its schema's type."""
    names = {"string": str, "boolean": bool, "object": dict, "array": list, "integer": int}

    def check(value: Any, schema: dict[str, Any], path: str) -> None:
        types = schema.get("type")
        if isinstance(types, str) and types in names:
            assert isinstance(value, names[types]), f"{path}: {value!r} is not {types}"
        if isinstance(value, dict) and "properties" in schema:
            for key, sub in value.items():
                check(sub, schema["properties"][key], f"{path}.{key}")

    check(VALUES, SCHEMA, "")
