"""Property-based tests (hypothesis) of the config parser: printed configs parse back identical (pbtxt and
Triton's JSON), any text is a config or an InvalidInput, and version policies pick what they say."""
from __future__ import annotations

import json

from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as pb

from modelplex import model_config
from modelplex.core.errors import InvalidInput

FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8)
data_types = st.sampled_from([v for k, v in pb.DataType.items() if k != "TYPE_INVALID"])


@st.composite
def tensor_configs(draw, message):
    tensor = message(name=draw(names), data_type=draw(data_types),
                     dims=draw(st.lists(st.integers(-1, 2**40).filter(bool), max_size=4)))
    if message is pb.ModelInput:
        tensor.optional = draw(st.booleans())
    return tensor


@st.composite
def configs(draw) -> pb.ModelConfig:
    config = pb.ModelConfig(name=draw(names), backend=draw(st.sampled_from(["", "onnxruntime", "python"])),
                            max_batch_size=draw(st.integers(0, 2**31 - 1)))
    config.input.extend(draw(st.lists(tensor_configs(pb.ModelInput), max_size=3)))
    config.output.extend(draw(st.lists(tensor_configs(pb.ModelOutput), max_size=3)))
    policy = draw(st.sampled_from(["none", "latest", "all", "specific"]))
    if policy == "latest":
        config.version_policy.latest.num_versions = draw(st.integers(1, 5))
    elif policy == "all":
        config.version_policy.all.SetInParent()
    elif policy == "specific":
        config.version_policy.specific.versions.extend(draw(st.lists(st.integers(1, 2**40), max_size=4)))
    for key, value in draw(st.dictionaries(names, names, max_size=3)).items():
        config.parameters[key].string_value = value
    if draw(st.booleans()):
        config.dynamic_batching.max_queue_delay_microseconds = draw(st.integers(0, 2**63 - 1))
    return config


@FAST
@given(configs())
def test_pbtxt_round_trip(config):
    assert model_config.parse_pbtxt(text_format.MessageToString(config)) == config


@FAST
@given(configs())
def test_triton_json_round_trip(config):
    text = model_config.to_json(config)
    assert model_config.parse_json(text) == config
    # 64-bit integers are JSON numbers, as Triton prints them (protobuf's JSON would quote them).
    if config.HasField("dynamic_batching"):
        assert type(json.loads(text)["dynamic_batching"]["max_queue_delay_microseconds"]) is int


@FAST
@given(configs())
def test_validate_raises_only_invalid_input(config):
    try:
        model_config.validate(config)
    except InvalidInput as e:
        assert e.status == 400 and e.message


@FAST
@given(st.one_of(st.text(max_size=80), st.builds(lambda c, cut: text_format.MessageToString(c)[:cut],
                                                  configs(), st.integers(0, 200))))
def test_any_text_is_a_config_or_invalid_input(text):
    for parse in (model_config.parse_pbtxt, model_config.parse_json):
        try:
            assert isinstance(parse(text), pb.ModelConfig)
        except InvalidInput:
            pass


@FAST
@given(configs(), st.sets(st.integers(1, 20), max_size=8))
def test_version_policy_selects_what_it_says(config, available):
    chosen = model_config.select_versions(config, list(available))
    assert chosen == sorted(chosen) and set(chosen) <= available
    policy = config.version_policy.WhichOneof("policy_choice")
    if policy == "all":
        assert chosen == sorted(available)
    elif policy == "specific":
        assert set(chosen) == available & set(config.version_policy.specific.versions)
    else:
        n = config.version_policy.latest.num_versions if policy == "latest" else 1
        assert chosen == sorted(available)[-n:] if available else chosen == []
