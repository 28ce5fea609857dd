"""TLS round trips with the real clients: HTTPS (with and without client certificates) and gRPC over SSL/mTLS."""
from __future__ import annotations

import ssl
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException


def simple_inputs(module):
    tensors = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    tensors[0].set_data_from_numpy(np.arange(16, dtype=np.int32)[None])
    tensors[1].set_data_from_numpy(np.ones((1, 16), np.int32))
    return tensors


def tls_args(certs, mutual: bool) -> list[str]:
    args = ["--http-server-cert", str(certs.server_cert), "--http-server-key", str(certs.server_key),
            "--grpc-use-ssl", "true", "--grpc-server-cert", str(certs.server_cert),
            "--grpc-server-key", str(certs.server_key), "--grpc-root-cert", str(certs.ca)]
    if mutual:
        args += ["--http-root-cert", str(certs.ca), "--grpc-use-ssl-mutual", "true"]
    return args


def context_factory(certs, with_client_cert: bool):
    def factory():
        context = ssl.create_default_context(cafile=str(certs.ca))
        if with_client_cert:
            context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
        return context
    return factory


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_tls_round_trip(example_repo, certs, mutual):
    with ServerProcess([example_repo], *tls_args(certs, mutual)) as s:
        https = httpclient.InferenceServerClient(s.http_url, ssl=True,
                                                 ssl_context_factory=context_factory(certs, mutual))
        assert https.is_server_ready()
        np.testing.assert_array_equal(https.infer("simple", simple_inputs(httpclient)).as_numpy("OUTPUT0"),
                                      np.arange(1, 17, dtype=np.int32)[None])
        client_cert = {"private_key": str(certs.client_key), "certificate_chain": str(certs.client_cert)}
        secure = grpcclient.InferenceServerClient(s.grpc_url, ssl=True, root_certificates=str(certs.ca),
                                                  **(client_cert if mutual else {}))
        assert secure.is_server_ready()
        np.testing.assert_array_equal(secure.infer("simple", simple_inputs(grpcclient)).as_numpy("OUTPUT1"),
                                      np.arange(-1, 15, dtype=np.int32)[None])

        # Plain text on a TLS port, or a client that cannot prove the server's identity, gets nothing.
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://{s.http_url}/v2/health/ready", timeout=5)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"https://{s.http_url}/v2/health/ready", timeout=5)  # system CAs do not know ours
        with pytest.raises(InferenceServerException):
            grpcclient.InferenceServerClient(s.grpc_url).is_server_ready(client_timeout=5)
        if mutual:
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"https://{s.http_url}/v2/health/ready", verify=context_factory(certs, False)(), timeout=5)
            no_cert = grpcclient.InferenceServerClient(s.grpc_url, ssl=True, root_certificates=str(certs.ca))
            with pytest.raises(InferenceServerException):
                no_cert.is_server_ready(client_timeout=5)
        # Idle TLS keep-alive connections must not hold up the exit (asyncio's SSL shutdown waits 30 s).
        started = time.monotonic()
        assert s.stop() == 0 and time.monotonic() - started < 10


def test_inconsistent_tls_flags_are_usage_errors(example_repo, certs):
    import subprocess
    import sys

    for args in (["--grpc-use-ssl", "true"], ["--http-server-cert", str(certs.server_cert)],
                 ["--grpc-use-ssl-mutual", "true", "--grpc-server-cert", str(certs.server_cert),
                  "--grpc-server-key", str(certs.server_key)]):
        done = subprocess.run([sys.executable, "-m", "modelplex", "serve", "--model-repository", str(example_repo),
                               *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "error:" in done.stderr, (args, done.stderr)
