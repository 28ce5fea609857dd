"""`modelplex models|adapters|health` against a real server: tables, --json, and exit codes for scripts."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from helpers.serverproc import ServerProcess

from modelplex.server.cli import main


@pytest.fixture(scope="module")
def url(example_repo):
    with ServerProcess([example_repo], "--model-control-mode", "explicit", "--load-model", "simple") as s:
        yield f"http://{s.http_url}"


def run(capsys, *argv) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_list_load_unload_and_stats(url, capsys):
    code, out, _ = run(capsys, "models", "list", "--url", url)
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["NAME", "VERSION", "STATE", "REASON"]
    assert lines[1].split() == ["simple", "1", "READY"] and lines[2].split() == ["simple_string"]
    assert run(capsys, "models", "load", "simple_string", "--url", url)[:2] == (0, "loaded simple_string\n")
    code, out, _ = run(capsys, "models", "list", "--url", url, "--json")
    assert code == 0 and {r["name"]: r.get("state") for r in json.loads(out)} == {"simple": "READY",
                                                                                   "simple_string": "READY"}
    assert run(capsys, "models", "unload", "simple_string", "--url", url)[0] == 0
    code, out, _ = run(capsys, "models", "config", "simple", "--url", url)
    assert code == 0 and json.loads(out)["max_batch_size"] == 8
    code, out, _ = run(capsys, "models", "stats", "simple", "--url", url)
    assert code == 0 and out.split()[:8] == ["NAME", "VERSION", "SUCCESS", "FAIL", "INFERENCES", "EXECUTIONS",
                                              "MEAN_MS", "QUEUE_MS"]
    assert out.splitlines()[1].split()[:2] == ["simple", "1"]


def test_server_errors_exit_1_with_the_servers_message(url, capsys):
    code, _, err = run(capsys, "models", "load", "no_such_model", "--url", url)
    assert code == 1 and "the server answered 4" in err and "no_such_model" in err, err
    code, out, _ = run(capsys, "adapters", "list", "simple", "--url", url)
    assert code == 0 and out.split() == ["NAME", "STATE", "SOURCE"]
    code, _, err = run(capsys, "adapters", "load", "simple", "a1", "--url", url)
    assert code == 1 and "the server answered 501: model 'simple' does not serve LoRA adapters" in err, err


def test_health_exits_0_only_when_ready(url, capsys):
    """With --strict-readiness (the default) an unloaded model makes the server not ready."""
    assert run(capsys, "models", "load", "simple_string", "--url", url)[0] == 0
    assert run(capsys, "health", "--url", url)[:2] == (0, "live: yes\nready: yes\n")
    assert run(capsys, "models", "unload", "simple_string", "--url", url)[0] == 0
    code, out, _ = run(capsys, "health", "--url", url, "--json")
    assert code == 1 and json.loads(out) == {"live": True, "ready": False}


def test_unreachable_server_exits_3_and_usage_errors_exit_2(capsys):
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, _, err = run(capsys, "health", "--url", f"http://127.0.0.1:{port}")
    assert code == 3 and "cannot reach the server" in err
    assert run(capsys, "models", "frobnicate")[0] == 2
    # As a script sees it: the installed entry point's exit status.
    proc = subprocess.run([sys.executable, "-m", "modelplex", "models", "list", "--url", f"http://127.0.0.1:{port}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "cannot reach the server" in proc.stderr


def test_the_admin_token_comes_from_a_flag_the_environment_or_a_file(example_repo, tmp_path, capsys, monkeypatch):
    token_file = tmp_path / "admin-token"
    token_file.write_text("cli-secret\n")
    with ServerProcess([example_repo], "--model-control-mode", "explicit", "--load-model", "simple",
                       "--admin-token-file", str(token_file)) as s:
        url = f"http://{s.http_url}"
        code, _, err = run(capsys, "models", "list", "--url", url)
        assert code == 1 and "401" in err and "admin token" in err
        assert run(capsys, "models", "list", "--url", url, "--token", "wrong")[0] == 1
        assert run(capsys, "models", "list", "--url", url, "--token", "cli-secret")[0] == 0
        assert run(capsys, "models", "list", "--url", url, "--token-file", str(token_file))[0] == 0
        monkeypatch.setenv("MODELPLEX_TOKEN_FILE", str(token_file))
        assert run(capsys, "models", "unload", "simple", "--url", url)[0] == 0
        monkeypatch.delenv("MODELPLEX_TOKEN_FILE")
        monkeypatch.setenv("MODELPLEX_TOKEN", "cli-secret")
        assert run(capsys, "models", "load", "simple", "--url", url)[0] == 0
        code, _, err = run(capsys, "models", "list", "--url", url, "--token-file", str(tmp_path / "missing"),
                           "--token", "")
        assert code == 2 and "--token-file" in err


def test_bad_input_gives_clear_messages_and_exit_codes(url, capsys):
    """Statistics of a model that does not exist, unknown or malformed trace/log settings."""
    code, _, err = run(capsys, "models", "stats", "no_such_model", "--url", url)
    assert code == 1 and "404" in err and "no_such_model" in err, err
    code, _, err = run(capsys, "trace", "trace_colour=red", "--url", url)
    assert code == 1 and "unknown trace setting 'trace_colour'" in err, err
    code, _, err = run(capsys, "trace", "trace_rate=0", "--url", url)
    assert code == 1 and "trace_rate must be an integer >= 1" in err, err
    code, _, err = run(capsys, "trace", "--model", "no_such_model", "trace_rate=1", "--url", url)
    assert code == 1 and "no_such_model" in err, err
    code, _, err = run(capsys, "logging", "log_colour=blue", "--url", url)
    assert code == 1 and "unknown log setting 'log_colour'" in err, err
    code, _, err = run(capsys, "logging", "log_verbose_level", "--url", url)
    assert code == 2 and "expected KEY=VALUE" in err, err


def test_trace_and_log_settings_round_trip(url, capsys):
    code, out, _ = run(capsys, "trace", "--model", "simple", "trace_rate=10", "trace_count=5", "--url", url, "--json")
    assert code == 0 and json.loads(out)["trace_rate"] == "10" and json.loads(out)["trace_count"] == "5"
    code, out, _ = run(capsys, "trace", "--model", "simple", "trace_rate=null", "trace_count=null", "--url", url)
    rows = [line.split(maxsplit=1) for line in out.splitlines()]
    assert code == 0 and rows[0] == ["SETTING", "VALUE"] and ["trace_rate", "1000"] in rows, out
    code, out, _ = run(capsys, "logging", "log_verbose_level=1", "--url", url, "--json")
    assert code == 0 and json.loads(out)["log_verbose_level"] == 1
    assert run(capsys, "logging", "log_verbose_level=0", "--url", url)[0] == 0


SLOW_CONFIG = """name: "slow_start"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
"""
SLOW_MODEL = '''import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(1.0)  # a long load

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")]) for r in requests]
'''


def test_a_long_load_shows_its_progress_in_the_cli_and_the_server_log(tmp_path, capsys):
    (tmp_path / "slow_start" / "1").mkdir(parents=True)
    (tmp_path / "slow_start" / "config.pbtxt").write_text(SLOW_CONFIG)
    (tmp_path / "slow_start" / "1" / "model.py").write_text(SLOW_MODEL)
    with ServerProcess([tmp_path], "--model-control-mode", "explicit") as s:
        code, out, err = run(capsys, "models", "load", "slow_start", "--url", f"http://{s.http_url}")
        log = s.log()
    assert (code, out) == (0, "loaded slow_start\n"), err
    assert "loading slow_start version 1: creating instance slow_start_0_1 (2/2)" in err, err
    assert "model slow_start version 1 loading: creating instance slow_start_0_0 (1/2)" in log
    assert "model slow_start version 1 loading: creating instance slow_start_0_1 (2/2)" in log
