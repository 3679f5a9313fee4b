#!/usr/bin/env python3
"""Renders a kustomization the way `kustomize build` does, for the subset deploy/ uses: `resources`
(files and directories), `components`, and `patches` with a `target` (kind, name) and an inline
JSON 6902 patch. Prints the objects as one multi-document YAML stream. Used by the tests, which have no
kustomize binary; `kubectl apply -k` gives the same objects.

usage: render_kustomize.py DIR
"""
import copy
import pathlib
import sys

import yaml


def load_objects(path):
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def pointer(path):
    return [part.replace("~1", "/").replace("~0", "~") for part in path.lstrip("/").split("/")]


def apply_json_patch(obj, operations):
    for op in operations:
        *parents, last = pointer(op["path"])
        target = obj
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        kind = op["op"]
        if kind == "add":
            if isinstance(target, list):
                value = copy.deepcopy(op["value"])
                target.append(value) if last == "-" else target.insert(int(last), value)
            else:
                target[last] = copy.deepcopy(op["value"])
        elif kind == "replace":
            if isinstance(target, list):
                target[int(last)] = copy.deepcopy(op["value"])
            else:
                if last not in target:
                    raise ValueError(f"replace of missing {op['path']}")
                target[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del target[int(last) if isinstance(target, list) else last]
        else:
            raise ValueError(f"unsupported op {kind}")


def build(directory):
    directory = pathlib.Path(directory)
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    known = {"apiVersion", "kind", "resources", "components", "patches"}
    unknown = set(kustomization) - known
    if unknown:
        sys.exit(f"{directory}/kustomization.yaml: unsupported keys {sorted(unknown)}")
    objects = []
    for resource in kustomization.get("resources", []):
        path = directory / resource
        objects += build(path) if path.is_dir() else load_objects(path)
    for component in kustomization.get("components", []):
        objects += build(directory / component)
    if kustomization.get("kind") == "Component":
        # A component's patches apply to the objects of the kustomization that includes it.
        return objects
    patches = list(kustomization.get("patches", []))
    for component in kustomization.get("components", []):
        patches += yaml.safe_load((directory / component / "kustomization.yaml").read_text()).get("patches", [])
    for patch in patches:
        target = patch["target"]
        matched = [o for o in objects if o["kind"] == target["kind"] and o["metadata"]["name"] == target["name"]]
        if not matched:
            sys.exit(f"{directory}: patch target {target} matches nothing")
        for obj in matched:
            apply_json_patch(obj, yaml.safe_load(patch["patch"]))
    return objects


def main():
    objects = build(sys.argv[1])
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))


if __name__ == "__main__":
    main()
