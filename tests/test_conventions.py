"""Acceptance in each engine's convention (`report --convention`), computed by hand from constructed rows: a chain
whose iterations all draft, one with an iteration that drafts nothing and a cut last block, and a tree."""

from __future__ import annotations

import pytest

from helpers import write_run
from specbench.analysis import load, report, selection
from specbench.analysis.conventions import CONVENTIONS

# row a: 4 iterations, all drafting 4 nodes (D 16), A 10 accepted, N = A + I = 14 tokens, no cut
# row b: 4 iterations of which 3 drafted (k 3, D 12), A 7; the last block cut by 1 at the stop: N = 7 + 4 - 1 = 10
# pooled: N 24, C 8, I 8, A 17, D 28, k 7
ROWS = [{"new": 14, "s": 1.0, "calls": 4, "iterations": 4, "drafted": 16, "accepted": 10, "k": 4},
        {"new": 10, "s": 1.0, "calls": 4, "iterations": 4, "drafted": 12, "accepted": 7, "k": 3}]
TRUTH = {"specbench": {"τ = N / C": 24 / 8, "#match = A / k": 17 / 7, "AccRate = A / D": 17 / 28},
         "vllm": {"mean acceptance length = 1 + A / num_drafts": 1 + 17 / 7,
                  "draft acceptance rate = A / num_draft_tokens": 17 / 28, "num_drafts": 7},
         "sglang": {"accept len = (A + verify steps) / verify steps": 25 / 8, "verify steps": 8},
         "eagle": {"τ (average acceptance length) = (A + steps) / steps": 25 / 8},
         "spec_bench": {"#Mean Accepted Tokens = (A + steps) / steps": 25 / 8}}


@pytest.mark.parametrize("name", sorted(CONVENTIONS))
def test_each_convention_by_hand(tmp_path, name):
    write_run(tmp_path, "v", "vanilla", ROWS, gamma=4)
    write_run(tmp_path, "ar", "ar", [{"new": 14, "s": 2.0}, {"new": 10, "s": 2.0}])
    rep = report.build_report(load.load_runs(tmp_path), convention=name)
    tables = [t for t in rep.tables if t.name == f"acceptance_{name}"]
    if name == "specbench":  # the overview is specbench's own: no extra table
        assert not tables
        from specbench.analysis.conventions import convention_table
        tables = [convention_table(selection.groups(load.load_runs(tmp_path))[0], name)]
    (table,) = tables
    row = table.values.loc[("p · gsm8k", "vanilla")].droplevel(0)
    assert dict(row) == pytest.approx(TRUTH[name])
    assert table.values.loc[("p · gsm8k", "ar")].isna().all()  # nothing drafted: no acceptance
    assert CONVENTIONS[name][0] in table.title


def test_the_conventions_part_where_the_rules_say():
    """Every iteration drafting, nothing cut: vLLM's 1 + A/k = Spec-Bench's (A + I)/I = specbench's τ. An iteration
    drafting nothing lowers (A + I)/I but not 1 + A/k; a cut block lowers τ alone."""
    def values(name, c):
        return [f(c) for _, f, _ in CONVENTIONS[name][1]]

    full = {"N": 14.0, "C": 4.0, "I": 4.0, "A": 10.0, "D": 16.0, "k": 4.0}
    assert values("vllm", full)[0] == values("spec_bench", full)[0] == values("specbench", full)[0] == 3.5
    idle = {**full, "I": 5.0, "C": 5.0, "N": 15.0}  # one more iteration, drafting nothing
    assert values("vllm", idle)[0] == 3.5 and values("spec_bench", idle)[0] == 3.0 == values("specbench", idle)[0]
    cut = {**full, "N": 13.0}
    assert values("specbench", cut)[0] == 3.25 and values("spec_bench", cut)[0] == 3.5


def test_the_cli_names_the_convention_and_refuses_unknown_ones(tmp_path, capsys):
    write_run(tmp_path / "res", "v", "vanilla", ROWS, gamma=4)
    out = tmp_path / "out"
    assert report.main([str(tmp_path / "res"), "--no-figures", "--out", str(out), "--convention", "vllm"]) == 0
    text = (out / "acceptance_vllm.md").read_text()
    assert "Acceptance in vLLM's convention" in text and f"| vanilla | {1 + 17 / 7:.2f} | {17 / 28:.3f} | 7 |" in text
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "res"), "--convention", "medusa"])
    assert "invalid choice: 'medusa'" in capsys.readouterr().err


# the overview's acceptance columns per convention, by hand from ROWS (pooled: A 17, D 28, k 7, I 8, N 24, C 8)
OVERVIEW_TRUTH = {"specbench": {"AccRate": 17 / 28, "τ": 24 / 8},
                  "vllm": {"draft acceptance rate (vLLM)": 17 / 28,
                           "mean acceptance length (vLLM) = 1 + A / num_drafts": 1 + 17 / 7},
                  "sglang": {"accept len (SGLang) = (A + steps) / steps": 25 / 8},
                  "eagle": {"τ (EAGLE) = (A + steps) / steps": 25 / 8},
                  "spec_bench": {"#Mean Accepted Tokens (Spec-Bench) = (A + steps) / steps": 25 / 8}}


@pytest.mark.parametrize("name", sorted(CONVENTIONS))
def test_the_overview_speaks_the_convention(tmp_path, name):
    """The overview's AccRate and τ become the convention's columns (values by hand, each with an interval around
    it), named in the title; specbench's columns are gone from the others; ar's cells stay empty. The categories
    table's τ is the convention's acceptance length."""
    rows = [{**r, "category": "c"} for r in ROWS]
    write_run(tmp_path, "v", "vanilla", rows, gamma=4)
    write_run(tmp_path, "ar", "ar", [{"new": 14, "s": 2.0, "category": "c"}, {"new": 10, "s": 2.0, "category": "c"}])
    rep = report.build_report(load.load_runs(tmp_path), convention=name)
    ov = next(t for t in rep.tables if t.name.startswith("overview"))
    cols = list(ov.values.columns.get_level_values(1))
    for column, truth in OVERVIEW_TRUTH[name].items():
        assert ov.values.loc[("p · gsm8k", "vanilla"), ("", column)] == pytest.approx(truth)
        cell = ov.cells.loc[("p · gsm8k", "vanilla"), ("", column)]
        lo, hi = (float(x) for x in cell.split("[")[1].rstrip("]").split("–"))
        assert lo - 0.005 <= truth <= hi + 0.005, cell  # the printed interval (rounded) holds the value
        if name != "specbench":  # specbench's τ is ar's too (1.00)
            assert ov.cells.loc[("p · gsm8k", "ar"), ("", column)] == ""
    if name != "specbench":
        assert "AccRate" not in cols and "τ" not in cols
        assert f"acceptance in {CONVENTIONS[name][0]} convention" in ov.title
    cats = next(t for t in rep.tables if t.name.startswith("categories"))
    length = list(OVERVIEW_TRUTH[name])[-1]
    assert cats.values.loc[("p · gsm8k", "vanilla · c"), ("", length)] == pytest.approx(OVERVIEW_TRUTH[name][length])
