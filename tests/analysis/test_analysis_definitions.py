"""A record made under a method's earlier definition is never read as the method it is today: analysis names it with
the definition keys that differ (`analysis.schema.defined_method`), puts it right after its method, and says which data
it read (`analysis.methods.data_of`)."""

from analysis_synth import record, write

from analysis import methods as M
from analysis.collect import collect
from analysis.schema import defined_method
from suite_schema import registry

LWF_BEFORE = {"rank": 8, "alpha": 16, "dropout": 0.0, "target_modules": None, "lwf_lambda": 1.0, "batch_size": 8}


def test_an_lwf_record_from_before_distill_on_existed_is_named_as_the_retained_definition():
    assert registry.method_values("lwf")["distill_on"] == "target"  # today's LwF: Li & Hoiem's
    assert defined_method("lwf", {"name": "lwf", **LWF_BEFORE}) == "lwf[distill_on=retained,temperature=1]"
    today = {**LWF_BEFORE, "distill_on": "target", "temperature": 2.0, "batch_size": None}
    assert defined_method("lwf", today) == "lwf"
    # Only the keys away from today's value are named; the retained variant at its own values is itself.
    assert defined_method("lwf", {**today, "temperature": 1.0}) == "lwf[temperature=1]"
    assert defined_method("lwf_retained", {**LWF_BEFORE, "distill_on": "retained", "temperature": 1.0}) == "lwf_retained"


def test_methods_without_definition_keys_and_unknown_methods_keep_their_names():
    assert defined_method("lora", {"rank": 8}) == "lora"
    assert defined_method("atlas", {}) == "atlas"
    assert defined_method("not_a_method", {"definition": "x"}) == "not_a_method"


def test_changed_baselines_name_records_without_the_definition_key_by_the_earlier_one():
    for method in ("inflora", "ewc", "corda", "loranull"):
        values = registry.method_values(method)
        assert values["definition"] == "authors", method
        knobs = {k: v for k, v in values.items() if k != "definition"}
        assert defined_method(method, knobs) == f"{method}[definition=2026-11]"
        assert defined_method(method, values) == method


def test_collect_reads_old_records_under_their_definition_and_the_main_table_says_their_data(tmp_path):
    for rec in (record("lwf", 0, 0.5, knobs=LWF_BEFORE, earlier=True),
                record("lwf", 0, 0.3, knobs={**LWF_BEFORE, "distill_on": "target", "temperature": 2.0, "batch_size": None}),
                record("lora", 0, 0.6)):
        write(tmp_path, rec)
    table = collect([tmp_path]).table
    assert sorted(table["method"]) == ["lora", "lwf", "lwf[distill_on=retained,temperature=1]"]
    assert M.data_of("lwf") == "target only"
    assert M.data_of("lwf[distill_on=retained,temperature=1]") == "retained prompts"  # what lwf_retained reads
    assert M.data_of("inflora[definition=2026-11]") == M.data_of("inflora") == "retained activations"
    assert M.ordered(["lwf_retained", "lwf[distill_on=retained,temperature=1]", "lwf", "lora"]) == \
        ["lora", "lwf", "lwf[distill_on=retained,temperature=1]", "lwf_retained"]
