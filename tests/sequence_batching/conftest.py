"""One server for the sequence-batcher tests: the probe model under several `sequence_batching`
configs, and the stateful examples of examples/sequence_models.py."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.python_clients import SERVER_ENV, load_args

PROBE = Path(__file__).resolve().parent / "models" / "seq_probe"
EXAMPLES = ["simple_sequence", "simple_dyna_sequence", "simple_string_dyna_sequence", "simple_sequence_state"]


def _control(name: str, kind: str, values: str = "int32_false_true: [ 0, 1 ]") -> str:
    return f'{{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{kind} {values} }} ] }}'


def probe_config(name: str, max_batch_size: int, strategy: str, corrid_type: str, count: int = 1,
                 idle_us: int = 5_000_000, start: str = "int32_false_true: [ 0, 1 ]",
                 end: str = "int32_false_true: [ 0, 1 ]") -> str:
    controls = ", ".join([_control("START", "START", start), _control("END", "END", end),
                          _control("READY", "READY"),
                          f'{{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }}'])
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
sequence_batching {{ max_sequence_idle_microseconds: {idle_us} {strategy} control_input [ {controls} ] }}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""


PROBES = {
    # direct: 2 instances x 4 slots; CORRID as Triton's dyna example has it
    "seq_direct": probe_config("seq_direct", 4, "direct { }", "TYPE_UINT64", count=2),
    # oldest: batches of 4 sequences, waiting up to 2 s for them (the test starts 4 at once)
    "seq_oldest": probe_config("seq_oldest", 8, "oldest { max_candidate_sequences: 8 preferred_batch_size: [ 4 ] "
                               "max_queue_delay_microseconds: 2000000 }", "TYPE_INT64",
                               start="fp32_false_true: [ 0, 1 ]", end="bool_false_true: [ false, true ]"),
    "seq_idle": probe_config("seq_idle", 2, "", "TYPE_INT32", idle_us=500_000),
    "seq_string": probe_config("seq_string", 2, "", "TYPE_STRING"),
}


@pytest.fixture(scope="session")
def sequence_repo(tmp_path_factory) -> Path:
    from build_repository import build

    out = tmp_path_factory.mktemp("sequence_repo")
    build(out, EXAMPLES)
    for name, config in PROBES.items():
        shutil.copytree(PROBE, out / name)
        (out / name / "config.pbtxt").write_text(config)
    return out


@pytest.fixture(scope="session")
def sequence_server(sequence_repo):
    from helpers.serverproc import ServerProcess

    with ServerProcess([sequence_repo], *load_args([*EXAMPLES, *PROBES]), env=SERVER_ENV) as server:
        yield server
