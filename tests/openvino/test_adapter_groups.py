"""AdapterGroups: whose requests OpenVINO GenAI may run, one adapter set at a time, fairly."""
from modelplex_openvino.llm_scheduling import AdapterGroups


def test_without_adapters_everything_runs_together():
    groups = AdapterGroups()
    for request_id, lora in enumerate(["", "", ""]):
        groups.add(lora, request_id)
    assert groups.next_admissions(is_running=True, single_group=True) == ("", [0, 1, 2])
    assert groups.num_waiting() == 0


def test_an_idle_pipeline_takes_the_group_whose_oldest_request_came_first():
    groups = AdapterGroups()
    groups.add("a", 0)
    groups.add("b", 1)
    groups.add("a", 2)
    assert groups.next_admissions(is_running=False) == ("a", [0, 2])
    assert groups.next_admissions(is_running=True) == ("a", [])  # b waits: a admits nothing more
    assert groups.next_admissions(is_running=False) == ("b", [1])


def test_the_running_group_admits_new_arrivals_only_while_no_other_group_waits():
    groups = AdapterGroups()
    groups.add("a", 0)
    assert groups.next_admissions(is_running=False) == ("a", [0])
    groups.add("a", 1)
    assert groups.next_admissions(is_running=True) == ("a", [1])
    groups.add("b", 2)
    groups.add("a", 3)
    assert groups.next_admissions(is_running=True) == ("a", [])
    # a has just run: b goes next although a's request 3 is older than nothing else b has
    assert groups.next_admissions(is_running=False) == ("b", [2])
    assert groups.next_admissions(is_running=False) == ("a", [3])


def test_a_busy_adapter_cannot_starve_a_quiet_one():
    groups, turns = AdapterGroups(), []
    next_id = iter(range(1000))
    for _ in range(5):
        for _ in range(3):
            groups.add("busy", next(next_id))
        groups.add("quiet", next(next_id))
        lora, admitted = groups.next_admissions(is_running=False)
        turns.append(lora)
    assert "quiet" in turns[:2] and turns.count("quiet") >= 2


def test_a_cancelled_waiting_request_leaves_its_group():
    groups = AdapterGroups()
    groups.add("a", 0)
    groups.add("b", 1)
    groups.discard("a", 0)
    assert groups.next_admissions(is_running=False) == ("b", [1])
    assert groups.num_waiting() == 0
