"""The one rule of every resume (treeopt/resume.py): kept work is reused only with the settings
it was made with, and the message names what differs. Expected strings written by hand."""

from treeopt.resume import differences_text, differing_settings, setting_differences


def test_differences_are_named_in_the_current_order_with_both_values():
    stored = {"steps": 5, "topk": 10, "data": "a.json", "format": "x"}
    now = {"data": "a.json", "steps": 6, "topk": 8}
    assert setting_differences(stored, now) == ["steps: 5 vs now 6", "topk: 10 vs now 8"]
    assert differing_settings(stored, now) == ["steps", "topk"]


def test_a_nested_record_compares_field_by_field_and_a_tree_is_not_printed():
    stored = {"measurement": {"repeats": 10, "warmup": 2}, "proposal": [[0], [1]]}
    now = {"measurement": {"repeats": 20, "warmup": 2}, "proposal": [[0]]}
    assert setting_differences(stored, now) == ["measurement.repeats: 10 vs now 20", "proposal: a different tree"]


def test_equal_settings_and_records_that_are_not_records():
    assert setting_differences({"a": 1, "b": [1, 2]}, {"a": 1, "b": [1, 2]}) == []
    assert setting_differences(None, {"a": 1}) == ["a: None vs now 1"]
    assert differences_text({}, {"a": 1, "b": 2, "c": 3, "d": 4}) == (
        "a: None vs now 1, b: None vs now 2, c: None vs now 3, and 1 more"
    )
