"""Validates the Inference Gateway manifests (deploy/k8s/inference-gateway/) against the published CRDs'
schemas: each custom resource whose apiVersion and kind a given CRD defines is checked against that
version's openAPIV3Schema, strictly (an unknown field fails, as `kubectl apply --validate=strict` refuses
it). The CRDs are kubernetes-sigs/gateway-api-inference-extension's config/crd/bases/*.yaml, given by
path: they are not kept in this repository. CEL rules (x-kubernetes-validations) are not evaluated.

    .venv/bin/python scripts/validate_inference_pool.py \
        --crd inference.networking.k8s.io_inferencepools.yaml \
        deploy/k8s/inference-gateway/*.yaml
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema
import yaml


def strict(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others (Kubernetes' strict mode)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
        if out.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def schemas(crds: Sequence[Path]) -> dict[tuple[str, str], Any]:
    """(apiVersion, kind) -> the strict schema of that version."""
    found = {}
    for path in crds:
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            for version in spec["versions"]:
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                found[key] = strict(version["schema"]["openAPIV3Schema"])
    return found


def validate(crds: Sequence[Path], manifests: Sequence[Path]) -> list[str]:
    """Every failure, as `file: kind/name: message`; raises nothing for a manifest of core kinds only."""
    known = schemas(crds)
    failures, checked = [], 0
    groups = {api.split("/")[0] for api, _ in known}
    for path in manifests:
        for document in yaml.safe_load_all(path.read_text()):
            if not document:
                continue
            key = (document.get("apiVersion", ""), document.get("kind", ""))
            name = f"{path}: {key[1]}/{document.get('metadata', {}).get('name', '?')}"
            if key in known:
                checked += 1
                validator = jsonschema.Draft7Validator(known[key])
                failures += [
                    f"{name}: {'.'.join(map(str, e.path))}: {e.message}"
                    for e in validator.iter_errors(document)
                ]
            elif key[0].split("/")[0] in groups:
                failures.append(f"{name}: no schema for {key[0]} {key[1]} in the CRDs given")
    if not checked:
        failures.append("no custom resource of the given CRDs was found")
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--crd", type=Path, action="append", required=True, help="a CRD file (repeatable)")
    parser.add_argument("manifests", type=Path, nargs="+")
    args = parser.parse_args(argv)
    failures = validate(args.crd, args.manifests)
    for failure in failures:
        print(failure, file=sys.stderr)
    print("valid" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
