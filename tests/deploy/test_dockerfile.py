"""The Dockerfile, parsed (no Docker engine here): multi-stage, non-root, `modelplex serve` as the
entrypoint with flags the real CLI accepts, the ports the manifests use, and sources that exist."""
from __future__ import annotations

import json
import subprocess

import yaml
from helpers.dockerfile_steps import ROOT, instructions, last, stages

from modelplex.server.cli import build_parser


def test_multi_stage_with_pinned_bases():
    all_stages = stages()
    assert len(all_stages) >= 2
    for stage in all_stages:
        image = stage[0][1].split()[0]
        assert ":" in image and not image.endswith(":latest"), image
    runtime = all_stages[-1]
    assert any(w == "COPY" and rest.startswith("--from=builder") for w, rest in runtime)
    assert not any(w == "RUN" and "pip install" in rest for w, rest in runtime), "build tools belong in the builder"
    # Every stage starts from the same Python: the builder's venv is copied into the runtime as it is.
    assert len({stage[0][1].split()[0] for stage in all_stages}) == 1


def test_only_the_builder_gets_a_c_compiler():
    """The span recorder is C: the builder installs gcc to compile it into the wheel; the runtime stage,
    for the default EXTRAS, installs no compiler (native_gpu's g++ is checked below)."""
    builder, runtime = stages()[0], stages()[-1]
    apt = " ".join(rest for w, rest in builder if w == "RUN" and "apt-get install" in rest).split()
    assert {"gcc", "libc6-dev"} <= set(apt), apt
    assert not any("gcc" in rest.split() for w, rest in runtime if w == "RUN")


def test_runs_as_the_non_root_user_the_deployment_expects():
    user = last(stages()[-1], "USER").split(":")[0]
    assert user.isdigit() and int(user) != 0
    pod = yaml.safe_load((ROOT / "deploy/kubernetes/deployment.yaml").read_text())["spec"]["template"]["spec"]
    assert int(user) == pod["securityContext"]["runAsUser"]


def test_entrypoint_is_modelplex_serve_with_valid_default_flags():
    runtime = stages()[-1]
    assert json.loads(last(runtime, "ENTRYPOINT")) == ["modelplex", "serve"]  # exec form: PID 1 gets SIGTERM
    args = build_parser().parse_args(["serve", *json.loads(last(runtime, "CMD"))])
    assert [str(p) for p in args.model_repository] == ["/models"]
    assert {int(p) for p in last(runtime, "EXPOSE").split()} == {args.http_port, args.grpc_port, args.metrics_port}


def test_copied_sources_exist():
    for word, rest in instructions():
        if word == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert (ROOT / source).exists(), source


def test_runtime_can_build_the_native_cpu_attention_op():
    """native_gpu compiles its CPU decode-attention op at model load: the runtime stage installs a
    compiler exactly when that backend is in EXTRAS, and the build cache lives under /tmp, which the
    pod mounts writable (its root filesystem is read-only)."""
    runtime = stages()[-1]
    install = next(rest for w, rest in runtime if w == "RUN" and "g++" in rest)
    condition = install.split("if ", 1)[1].split("; then", 1)[0]
    for extras, wanted in [("onnx", False), ("onnx,openvino", False), ("onnx,native_gpu", True), ("all", True)]:
        found = subprocess.run(["bash", "-c", condition], env={"EXTRAS": extras, "PATH": "/usr/bin:/bin"}).returncode == 0
        assert found == wanted, extras
    env = " ".join(rest for w, rest in runtime if w == "ENV").split()
    cache = next(item.split("=", 1)[1] for item in env if item.startswith("TORCH_EXTENSIONS_DIR="))
    pod = yaml.safe_load((ROOT / "deploy/kubernetes/deployment.yaml").read_text())["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"]
    writable = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]
    assert any(cache.startswith(path.rstrip("/") + "/") for path in writable), (cache, writable)
