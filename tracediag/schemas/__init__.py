"""JSON Schemas (draft 2020-12) of the documents tracediag writes, shipped with the package for the scripts and CI
jobs that read them: findings.json (`analyze`), check.json (`check`), diff.json (`diff`), each also what the
command prints with `--format json`.

    from tracediag.schemas import load_schema
    jsonschema.validate(doc, load_schema(doc["schema"]))

tests/test_json_outputs.py validates real outputs against them."""

from __future__ import annotations

import json
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

# the document's "schema" value -> its schema file, beside this module
SCHEMA_FILES = {
    "tracediag/findings-v1": "findings-v1.schema.json",
    "tracediag/check-v1": "check-v1.schema.json",
    "tracediag/diff-v1": "diff-v1.schema.json",
}


def schema_file(schema_id: str) -> Traversable:
    """The schema file of a document whose "schema" is `schema_id` (e.g. "tracediag/findings-v1")."""
    try:
        name = SCHEMA_FILES[schema_id]
    except KeyError:
        raise KeyError(f"no JSON Schema for {schema_id!r}; known: {', '.join(SCHEMA_FILES)}") from None
    return files(__name__) / name


def load_schema(schema_id: str) -> dict[str, Any]:
    return json.loads(schema_file(schema_id).read_text(encoding="utf-8"))
