"""neuron-plan --search: the space, its validity checks and arithmetic pruning, the ranked report (table, JSON,
HTML), and a search of a small pipeline script whose planned configuration equals its plan alone."""

import html.parser
import json

import pytest
from test_planning import plan

from neuron_distributed import plan_cli
from neuron_distributed.plan_search import ModelShape, configurations, load_space
from neuron_distributed.plan_search_report import pareto_front, rank, write_html

# A Llama-shaped config.json of 8.95 B parameters (Llama-3.1-70B's layer, 8 of them): at 8 B a parameter it cannot
# fit a trn1 core's 16 GiB split 4 ways (16.7 GiB), and can split 8 ways.
_BIG = {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 8, "num_attention_heads": 64,
        "num_key_value_heads": 8, "vocab_size": 128256}


def test_space_from_toml_json_and_axes(tmp_path):
    toml = tmp_path / "space.toml"
    toml.write_text('[axes]\ntp = [8, 16]\nac = ["--checkpoint", ""]\n')
    assert load_space(str(toml), ["pp=1,2", "schedule=1f1b"]) == {
        "tp": [8, 16], "ac": ["--checkpoint", ""], "pp": [1, 2], "schedule": ["1f1b"]}
    as_json = tmp_path / "space.json"
    as_json.write_text(json.dumps({"tp": [2], "nodes": 4}))
    assert load_space(str(as_json), []) == {"tp": [2], "nodes": [4]}
    with pytest.raises(SystemExit, match="is not NAME=V1,V2"):
        load_space(None, ["tp"])
    with pytest.raises(SystemExit, match="needs a space"):
        load_space(None, [])


def test_templates_fill_drop_empty_and_name_unknown_axes():
    space = {"tp": [2], "ac": ["--checkpoint", ""]}
    configs = configurations(space, ["python", "train.py", "--tp", "{tp}", "--dp", "{dp}", "{ac}", '{"k": 1}'],
                             instance="trn1.32xlarge", nodes=1)
    assert [c.command for c in configs] == [
        ["python", "train.py", "--tp", "2", "--dp", "16", "--checkpoint", '{"k": 1}'],
        ["python", "train.py", "--tp", "2", "--dp", "16", '{"k": 1}']]  # dp: the world (32) over tp x pp
    with pytest.raises(SystemExit, match=r"\{pp\}, which no axis gives"):
        configurations(space, ["python", "train.py", "--pp", "{pp}"], instance="trn1.32xlarge", nodes=1)


def test_invalid_and_pruned_configurations_say_why(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_BIG))
    model = ModelShape.from_config(str(config))
    assert model.parameters == 8 * 855_654_400 + 2 * 128256 * 8192 + 8192  # layers, embedding and head, final norm
    space = {"tp": [1, 3, 4], "pp": [2, 8], "global_batch": [64]}
    found = {(c.values["tp"], c.values["pp"]): (c.status, c.reason)
             for c in configurations(space, ["python", "t.py"], instance="trn1.32xlarge", nodes=1, model=model)}
    assert found == {
        (1, 2): ("pruned", "weights + gradients + optimizer states need at least 33.3 GiB a core (8.95 B parameters "
                           "/ 2 (tp x pp) x 8 B), more than its 16 GiB of HBM"),
        (1, 8): ("pending", None), (4, 2): ("pending", None), (4, 8): ("pending", None),
        (3, 2): ("invalid", "world size: 1 x trn1.32xlarge = 32 NeuronCores, not divisible by tp 3 x pp 2 = 6"),
        (3, 8): ("invalid", "world size: 1 x trn1.32xlarge = 32 NeuronCores, not divisible by tp 3 x pp 8 = 24")}
    (given,) = configurations({"dp": [2], "pp": [4]}, ["python", "t.py"], instance="trn1.32xlarge", nodes=1)
    assert given.reason == "world size: dp 2 x tp 1 x pp 4 = 8 ranks, but 1 x trn1.32xlarge = 32 NeuronCores"
    batches = configurations({"pp": [1, 8], "global_batch": [8]}, ["python", "t.py"], instance="trn1.32xlarge",
                             nodes=1)
    assert [c.reason for c in batches] == [
        "global batch 8 is not divisible by dp 32 x micro-batch 1 = 32",
        "2 micro-batches (global batch 8 / dp 4 / micro-batch 1) are fewer than the 8 pipeline stages"]
    (odd,) = configurations({"tp": [3]}, ["python", "t.py"], instance="trn1.2xlarge", nodes=3, model=model)
    assert (odd.status, odd.reason) == ("invalid", "64 attention heads are not divisible by tp 3")


def test_pruning_is_arithmetic_on_the_sharded_axes(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_BIG))
    model = ModelShape.from_config(str(config))
    found = {c.values["pp"]: c for c in configurations({"pp": [4, 8]}, ["python", "t.py"], instance="trn1.32xlarge",
                                                       nodes=1, model=model, sharded_by=("pp",))}
    assert found[4].status == "pruned"
    assert found[4].reason == ("weights + gradients + optimizer states need at least 16.7 GiB a core (8.95 B "
                               "parameters / 4 (pp) x 8 B), more than its 16 GiB of HBM")
    assert found[8].status == "pending"
    fp32 = configurations({"pp": [8]}, ["python", "t.py"], instance="trn1.32xlarge", nodes=1, model=model,
                          state_bytes=16, sharded_by=("pp",))
    assert fp32[0].status == "pruned"


def _planned(configs, times, costs, fits=None):
    """Configurations as a search leaves them, with made-up reports of the given step and cost (report tests)."""
    for config, step, cost, fit in zip(configs, times, costs, fits or [True] * len(configs), strict=True):
        config.status = "planned"
        config.report = {"fits": fit, "step_seconds": step, "cost_per_step_usd": cost,
                         "cost_per_million_tokens_usd": cost / 4096 * 1e6, "tokens_per_second": 4096 / step,
                         "mfu": 0.1, "peak_hbm_bytes": 2**30, "exposed_communication_seconds": 0.01,
                         "breakdown": {"matmul": step * 0.75, "collective:allreduce": step * 0.25},
                         "pipeline": {"bubble_fraction": 0.1}}
        config.tokens_per_step = 4096
    return configs


def _space(tps):
    return configurations({"tp": tps}, ["python", "t.py", "--tp", "{tp}"], instance="trn1.32xlarge", nodes=1)


def test_ranking_and_pareto_front():
    configs = _planned(_space([1, 2, 4, 8, 16]), times=[4.0, 2.0, 3.0, 1.0, 5.0], costs=[1.0, 3.0, 2.0, 6.0, 0.5],
                       fits=[True, True, True, True, False])
    assert [c.values["tp"] for c in rank(configs, "time")] == [8, 2, 4, 1, 16]  # what does not fit comes last
    assert [c.values["tp"] for c in rank(configs, "cost")] == [1, 4, 2, 8, 16]
    assert [c.values["tp"] for c in pareto_front(configs)] == [8, 2, 4, 1]  # each faster or cheaper than the rest
    configs[2].report["cost_per_million_tokens_usd"] = 1e9  # tp 4: slower than tp 2 and dearer now
    assert [c.values["tp"] for c in pareto_front(configs)] == [8, 2, 1]


class _Page(html.parser.HTMLParser):
    """What a browser would show of the page: its tags (and their classes), the table rows, external references."""

    def __init__(self):
        super().__init__()
        self.tags, self.rows, self.external, self.row = [], [], [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs.get("class")))
        self.external += [v for k, v in attrs.items() if k in ("src", "href") and v]
        if tag == "tr" and attrs.get("class") == "config":
            self.row = []
        if tag == "script":
            self.external.append("a script")

    def handle_data(self, data):
        if self.row is not None and data.strip():
            self.row.append(data.strip())

    def handle_endtag(self, tag):
        if tag == "tr" and self.row is not None:
            self.rows.append(self.row)
            self.row = None


def test_html_page_shows_the_front_and_the_table_with_nothing_to_fetch(tmp_path):
    configs = _space([1, 2, 4, 3])  # tp 3: invalid
    _planned(configs[:3], times=[3.0, 2.0, 1.0], costs=[1.0, 2.0, 3.0])
    summary = {"configurations": 4, "planned": 3, "failed": 0, "pruned": 0, "invalid": 1, "rank_plans_run": 3,
               "rank_plans_reused": 0, "ranks_needed": 3, "objective": "time", "wall_seconds": 1.0,
               "cpu_seconds": 1.0, "command": ["python", "t.py", "--tp", "{tp}"]}
    page_path = tmp_path / "search.html"
    write_html(str(page_path), rank(configs, "time"), summary)
    page = _Page()
    page.feed(page_path.read_text())
    assert page.external == []  # self-contained: no script, no fetched resource
    assert ("svg", "pareto") in page.tags and ("polyline", "front") in page.tags
    assert page.tags.count(("circle", "front")) == 3
    assert [row[:3] for row in page.rows] == [["1", "planned *", "tp=4"], ["2", "planned *", "tp=2"],
                                              ["3", "planned *", "tp=1"], ["4", "invalid", "tp=3"]]
    assert page.rows[3][-1].startswith("world size")
    assert page.tags.count(("svg", "breakdown")) == 3  # each planned configuration's step, split


def test_search_is_dispatched_and_refuses_cost_without_a_price(tmp_path):
    with pytest.raises(SystemExit, match=r"--objective cost needs a price for trn2.48xlarge.*--price-per-hour"):
        plan_cli.main(["--search", "--axis", "tp=1", "--instance", "trn2.48xlarge", "--objective", "cost", "--",
                       "python", "t.py"])


@pytest.mark.slow
@pytest.mark.multiprocess
def test_search_plans_shares_roles_and_its_best_equals_its_plan_alone(tmp_path):
    """A pipeline script over pp x micro-batches: invalid (pp 3 on 32 ranks), pruned (pp 4, by the model config's
    arithmetic), failed (2 micro-batches for 8 stages: PyTorch's error in the row, the search goes on) and planned
    (pp 8): its middle stages 1 to 6 share one rank plan (their neighbours on the same chip or across chips in
    turn: each prices its own send), and its figures equal neuron-plan's alone."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_BIG))
    page = tmp_path / "search.html"
    options = ("--search", "--axis", "pp=3,4,8", "--axis", "mb=2,16", "--instance", "trn1.32xlarge", "--steps", "2",
               "--jobs", "2", "--model-config", str(config), "--sharded-by", "pp", "--html", str(page))
    code, found, output = plan(tmp_path, "1f1b", "--pp", "{pp}", "--micro-batches", "{mb}", script="pipeline.py",
                               options=options)
    assert code == 0, output
    records = {(r["values"]["pp"], r["values"]["mb"]): r for r in found["configurations"]}
    assert {k: r["status"] for k, r in records.items()} == {
        (3, 2): "invalid", (3, 16): "invalid", (4, 2): "pruned", (4, 16): "pruned", (8, 2): "failed",
        (8, 16): "planned"}
    assert "Number of microbatches (2) must be greater than or equal to the number of stages (8)" in \
        records[(8, 2)]["error"]
    best = records[(8, 16)]
    assert best["rank_plans_run"] == 3 and best["rank_plans_reused"] == 5  # stages 0, 1, 7 planned
    assert found["search"]["rank_plans_run"] == 3 and found["search"]["ranks_needed"] == 8
    assert best["report"]["ranks_planned"] == [0, 1, 2, 3, 4, 5, 6, 7]
    code, alone, output = plan(tmp_path, "1f1b", "--pp", "8", "--micro-batches", "16", script="pipeline.py",
                               options=("--instance", "trn1.32xlarge", "--steps", "2", "--jobs", "2"))
    assert code == 0, output
    assert best["report"] == alone
    assert "<polyline" in page.read_text()
