"""The subset of kustomize that deploy/kubernetes/ uses, in Python, for machines without kubectl.

Supports ``resources`` (files and directories holding a kustomization.yaml, recursively) and
``patches`` given by ``path`` with strategic-merge semantics limited to what the overlays do:
``$patch: delete`` of a whole object and a merge of maps (a ConfigMap's data). Anything else
raises, so an overlay that grows past this subset fails loudly instead of rendering wrongly;
test_manifests.py checks the output equals ``kubectl kustomize`` where kubectl exists.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

ALLOWED = {"apiVersion", "kind", "resources", "patches"}


def _key(doc: dict[str, Any]) -> tuple[str, str, str]:
    meta = doc.get("metadata") or {}
    return doc["kind"], meta.get("namespace", ""), meta["name"]


def _merge(dst: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        elif isinstance(v, list):
            raise NotImplementedError(f"kustomize_lite: list patches ({k}) are not supported")
        else:
            dst[k] = v


def render(directory: str) -> list[dict[str, Any]]:
    with open(os.path.join(directory, "kustomization.yaml"), encoding="utf-8") as fh:
        kust = yaml.safe_load(fh)
    unknown = set(kust) - ALLOWED
    if unknown:
        raise NotImplementedError(f"kustomize_lite: unsupported fields {sorted(unknown)}")
    docs: list[dict[str, Any]] = []
    for res in kust.get("resources") or []:
        path = os.path.normpath(os.path.join(directory, res))
        if os.path.isdir(path):
            docs += render(path)
        else:
            with open(path, encoding="utf-8") as fh:
                docs += [d for d in yaml.safe_load_all(fh) if d]
    for patch in kust.get("patches") or []:
        if set(patch) != {"path"}:
            raise NotImplementedError("kustomize_lite: only `patches: - path:` is supported")
        with open(os.path.join(directory, patch["path"]), encoding="utf-8") as fh:
            for p in (d for d in yaml.safe_load_all(fh) if d):
                target = _key(p)
                match = [d for d in docs if _key(d) == target]
                if len(match) != 1:
                    raise ValueError(f"kustomize_lite: patch target {target} matched {len(match)} objects")
                if p.get("$patch") == "delete":
                    docs.remove(match[0])
                else:
                    _merge(match[0], {k: v for k, v in p.items() if k not in ("apiVersion", "kind")})
    return docs
