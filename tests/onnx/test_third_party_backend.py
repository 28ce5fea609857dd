"""A backend from a separately installed package: found through its `modelplex` entry point alone.

The test writes a tiny plugin distribution, pip-installs it into the venv (uninstalled afterwards),
and serves a model with `backend: "echo"` from it — no `pm.register` anywhere.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers.infer_clients import PROTOCOLS, infer, model_config, repository_index
from helpers.serverproc import ServerProcess

DISTRIBUTION = "modelplex-test-echo-backend"

PYPROJECT = f"""\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{DISTRIBUTION}"
version = "0.0.1"

[project.entry-points.modelplex]
test_echo = "modelplex_test_echo"

[tool.setuptools]
py-modules = ["modelplex_test_echo"]
"""

PLUGIN = '''\
"""A third-party modelplex backend: every INPUTn comes back as OUTPUTn."""
from modelplex import BackendSpec, InferResponse, InferTensor, ModelInstance, hookimpl


class EchoInstance(ModelInstance):
    def __init__(self, ictx):
        self.instance_name = ictx.name

    async def execute(self, requests):
        return [InferResponse(r.model_name, "", [
            InferTensor(t.name.replace("INPUT", "OUTPUT"), t.datatype, list(t.shape), t.data) for t in r.inputs])
            for r in requests]


@hookimpl
def modelplex_backends():
    return [BackendSpec(name="echo", create_instance=EchoInstance)]
'''

ECHO_CONFIG = """\
backend: "echo"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]
"""


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args], check=True)


@pytest.fixture(scope="module")
def echo_plugin_installed(tmp_path_factory):
    source = tmp_path_factory.mktemp("echo_plugin")
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "modelplex_test_echo.py").write_text(PLUGIN)
    pip("install", "--no-deps", "--no-build-isolation", str(source))
    try:
        yield
    finally:
        pip("uninstall", "--yes", DISTRIBUTION)


@pytest.fixture(scope="module")
def echo_server(echo_plugin_installed, tmp_path_factory, example_repo):
    repo = tmp_path_factory.mktemp("echo_repo")
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "config.pbtxt").write_text(ECHO_CONFIG)
    # The in-tree ONNX backend serves beside it from a second repository.
    with ServerProcess([repo, example_repo]) as server:
        yield server


def test_the_entry_point_is_visible_to_a_fresh_interpreter(echo_plugin_installed):
    probe = textwrap.dedent("""
        from modelplex.core.plugins import collect_backends, create_plugin_manager
        pm = create_plugin_manager()
        print(sorted(name for name, _ in pm.list_name_plugin()))
        print(sorted(collect_backends(pm)))
    """)
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    plugins, backends = out.splitlines()
    assert "'test_echo'" in plugins and "'onnx'" in plugins
    assert "'echo'" in backends and "'onnxruntime'" in backends


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_model_of_the_third_party_backend_serves(echo_server, protocol):
    assert repository_index(echo_server)["echo"]["state"] == "READY"
    assert model_config(echo_server, protocol, "echo")["backend"] == "echo"
    words = np.array([b"entry", b"points", b"\x00\xffraw"], dtype=np.object_)
    matrix = np.array([[1.5, -2.0], [0.25, 8.0]], dtype=np.float32)
    result = infer(echo_server, protocol, "echo", {"INPUT0": words, "INPUT1": matrix})
    assert result.as_numpy("OUTPUT0").tolist() == words.tolist()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), matrix)
    a = np.ones((1, 16), dtype=np.int32)
    np.testing.assert_array_equal(infer(echo_server, protocol, "simple", {"INPUT0": a, "INPUT1": a})
                                  .as_numpy("OUTPUT0"), a * 2)
