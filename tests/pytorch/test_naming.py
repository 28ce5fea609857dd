"""Triton's PyTorch naming rules, without torch or a server: which config tensor is which forward()
argument or result, and the load errors for names that cannot map."""
from __future__ import annotations

import pytest

from modelplex import InvalidInput
from modelplex_pytorch.naming import input_names, input_positions, named_index, output_selectors


def test_named_index_reads_the_digits_after_the_last_double_underscore():
    assert [named_index(n) for n in ("INPUT__0", "x__12", "a__b__3", "INPUT0", "x__", "x__1a")] == \
        [0, 12, 3, None, None, None]


def test_inputs_map_by_forward_argument_name_first_then_by_index_then_by_config_order():
    assert input_positions("m", ["b", "a"], ["a", "b"]) == {"b": 1, "a": 0}
    assert input_positions("m", ["INPUT__1", "INPUT__0"], ["a", "b"]) == {"INPUT__1": 1, "INPUT__0": 0}
    assert input_positions("m", ["first", "second"], ["a", "b"]) == {"first": 0, "second": 1}


def test_a_partial_config_keeps_default_names_for_the_rest():
    assert input_names("m", [], ["a", "b"]) == ["a", "b"]
    assert input_names("m", ["INPUT__1"], ["a", "b"]) == ["INPUT__0", "INPUT__1"]


@pytest.mark.parametrize(("names", "message"), [
    (["INPUT__0"], "config.pbtxt has 1 input(s) but the model's forward() takes 2 (a, b)"),
    (["INPUT__0", "INPUT__2"], "input 'INPUT__2' names index 2 but the model has 2 input(s)"),
    (["x__0", "y__0"], "two inputs name the same index"),
])
def test_inputs_that_cannot_map_are_refused(names, message):
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        input_positions("m", names, ["a", "b"])


def test_outputs_pick_by_index_from_tuples_and_dicts_and_by_key_from_dicts():
    by_index = output_selectors("m", ["OUTPUT__1", "OUTPUT__0"], 2, None)
    assert [s.pick("m", ("sum", "difference")) for s in by_index] == ["difference", "sum"]
    assert [s.pick("m", {"k0": "v0", "k1": "v1"}) for s in by_index] == ["v1", "v0"]
    by_key = output_selectors("m", ["total"], None, [])  # a TorchScript dict: keys known only at run time
    assert by_key[0].pick("m", {"scaled": 1, "total": 2}) == 2
    with pytest.raises(InvalidInput, match="output 'total' is not in what forward\\(\\) returned \\(keys scaled\\)"):
        by_key[0].pick("m", {"scaled": 1})
    single = output_selectors("m", ["y"], 1, None)  # no convention: config order
    assert single[0].pick("m", "tensor") == "tensor"


def test_outputs_beyond_what_forward_returns_are_refused():
    with pytest.raises(InvalidInput, match="output 'OUTPUT__2' names index 2 but the model has 2 output"):
        output_selectors("m", ["OUTPUT__2"], 2, None)
    with pytest.raises(InvalidInput, match="are not keys of the dict forward\\(\\) returns \\(a, b\\)"):
        output_selectors("m", ["c"], 2, ["a", "b"])
    with pytest.raises(InvalidInput, match="result 3 but forward\\(\\) returned 2"):
        output_selectors("m", ["OUTPUT__3"], None, None)[0].pick("m", ["x", "y"])
