"""Renders deploy/kubernetes for the tests: with `kubectl kustomize` where kubectl is installed,
else with `render` below, a small renderer of the kustomization features deploy/kubernetes
uses and nothing more (resources, namespace, images, secretGenerator with files, each FILE or
KEY=FILE, its Secret's new name given to the volumes and environment variables that name it).
Where kubectl is installed, a test checks that both give the same manifests, so the small one
stays honest.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

CLUSTER_SCOPED = {"Namespace"}
SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "images", "secretGenerator"}
_SUFFIX = re.compile(r"-[a-z0-9]{10}$")

Doc = dict[str, Any]


def kubectl_kustomize(directory: Path) -> list[Doc] | None:
    """What `kubectl kustomize` renders; None without kubectl."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True,
                         text=True, timeout=120, check=True)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def render(directory: Path) -> list[Doc]:
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - SUPPORTED
    assert not unknown, f"the small renderer does not do {unknown}: use kubectl kustomize"
    docs: list[Doc] = []
    for entry in spec.get("resources", []):
        path = directory / entry
        docs += render(path) if path.is_dir() else [
            doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    renamed = {}
    for generator in spec.get("secretGenerator", []):
        secret = _secret(directory, generator)
        renamed[generator["name"]] = secret["metadata"]["name"]
        docs.append(secret)
    for doc in docs:
        if "namespace" in spec and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = spec["namespace"]
        for pod in _pod_specs(doc):
            for volume in pod.get("volumes", []):
                if "secret" in volume:
                    name = volume["secret"]["secretName"]
                    volume["secret"]["secretName"] = renamed.get(name, name)
            for container in pod.get("containers", []) + pod.get("initContainers", []):
                container["image"] = _image(container["image"], spec.get("images", []))
                for variable in container.get("env", []):
                    ref = variable.get("valueFrom", {}).get("secretKeyRef")
                    if ref is not None:
                        ref["name"] = renamed.get(ref["name"], ref["name"])
    return docs


def _secret(directory: Path, generator: Doc) -> Doc:
    data = {}
    for entry in generator["files"]:  # FILE, or KEY=FILE
        key, _, name = entry.rpartition("=")
        data[key or name] = base64.b64encode((directory / name).read_bytes()).decode()
    digest = hashlib.sha256(repr(sorted(data.items())).encode()).hexdigest()[:10]
    return {"apiVersion": "v1", "kind": "Secret", "type": generator.get("type", "Opaque"),
            "metadata": {"name": f"{generator['name']}-{digest}"}, "data": data}


def _pod_specs(doc: Doc) -> list[Doc]:
    template = doc.get("spec", {}).get("template")
    return [template["spec"]] if template else []


def _image(image: str, images: list[Doc]) -> str:
    for rule in images:
        if image.split(":")[0].split("@")[0] == rule["name"]:
            return f"{rule.get('newName', rule['name'])}:{rule['newTag']}" if "newTag" in rule \
                else rule.get("newName", rule["name"])
    return image


def comparable(docs: list[Doc]) -> dict[tuple[str, str], Doc]:
    """Documents by kind and name, generated names' hash suffixes (which differ) removed, and
    Secrets' base64 unwrapped (kubectl breaks it into lines of 70 characters)."""
    text = yaml.safe_dump(docs)
    generated = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    for name in generated:
        text = text.replace(name, _SUFFIX.sub("", name))
    unwrapped = yaml.safe_load(text)
    for doc in unwrapped:
        if doc["kind"] == "Secret":
            doc["data"] = {key: "".join(value.split()) for key, value in doc["data"].items()}
    return {(d["kind"], d["metadata"]["name"]): d for d in unwrapped}
