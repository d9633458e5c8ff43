"""The report CLI's output: a requested table that cannot be built says why and which runs to add (exit status 1
when none could be), `--table` builds and writes only what it names, stdout is the tables under a heading each with
wrapped captions; and the analysis API: load_runs' summary columns by default, the full data on request."""

from __future__ import annotations

import json
import re

import pytest

from helpers import ROOT, write_run
from specbench.analysis import catalog, divergence, load, report, selection
from specbench.analysis.tables import WIDTH


def runs_folder(root):
    """ar, vanilla γ=5 and adasd, greedy, on pair p / gsm8k: 20, 30 and 45 tok/s."""
    write_run(root, "ar", "ar", [{"new": 20, "s": 1.0}])
    write_run(root, "vanilla", "vanilla", [{"new": 30, "s": 1.0, "drafted": 5, "accepted": 3, "k": 1}], gamma=5)
    write_run(root, "adasd", "adasd", [{"new": 45, "s": 1.0, "drafted": 5, "accepted": 4, "k": 1}])
    return root


def test_a_table_that_cannot_be_built_says_why_and_what_to_run(tmp_path, capsys):
    res = runs_folder(tmp_path / "res")
    assert report.main([str(res), "--table", "sd2_table1", "--baseline", "vanilla:gamma=8", "--format", "tex",
                        "--out", str(tmp_path / "out")]) == report.NOTHING_BUILT == 1
    out, err = capsys.readouterr()
    assert out == "" and not [p for p in (tmp_path / "out").iterdir() if p.name != report.MANIFEST]
    assert ("note: sd2_table1: not built: no run of its methods (distilled, sd2) nor of its baseline vanilla:gamma=8 "
            "at temperature 1; add them with: python run.py -m method=distilled,sd2 pair=p dataset=gsm8k decode=t1; "
            "python run.py method=vanilla method.gamma=8 pair=p dataset=gsm8k decode=t1 (the whole sweep: python "
            "run.py -m experiment=sd2_table1 pair=p)") in err
    assert "none of the tables asked for was built (exit status 1)" in err
    # one of two asked for is built: exit 0, the other named
    assert report.main([str(res), "--table", "adasd_table1_2", "--table", "gammatune_table2"]) == 0
    err = capsys.readouterr().err
    assert "note: gammatune_table2: not built: no run of its methods (heuristic, confidence, gammatune, " \
           "gammatune_plus); add it with: python run.py -m method=heuristic,confidence,gammatune,gammatune_plus" in err


def test_why_not_names_the_baseline_a_table_lacks(tmp_path):
    write_run(tmp_path, "sd2", "sd2", [{"new": 30, "s": 1.0}], temperature=1.0, gamma=8)
    runs = load.load_runs(tmp_path)
    assert catalog.why_not("sd2_table1", runs) == (
        "no run of its baseline vanilla:gamma=8 at temperature 1, which its speedups divide by; add it with: "
        "python run.py method=vanilla method.gamma=8 pair=p dataset=gsm8k decode=t1 (the whole sweep: python run.py "
        "-m experiment=sd2_table1 pair=p)")
    assert catalog.why_not("sd2_table5", runs).startswith("no run of its methods (distilled, sd2) nor of its "
                                                          "baseline vanilla:gamma=8 at temperature 0")


def test_table_builds_and_writes_only_what_it_names(tmp_path, capsys):
    res, out = runs_folder(tmp_path / "res"), tmp_path / "out"
    assert report.main([str(res), "--out", str(out), "--format", "md"]) == 0  # everything: overview, figures, ...
    everything = {p.name for p in out.iterdir()}
    assert {"overview.md", "adasd_table1.md", "adasd_table2.md"} <= everything
    capsys.readouterr()
    assert report.main([str(res), "--table", "adasd_table1_2", "--out", str(out), "--format", "md"]) == 0
    stdout = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir() if p.name != report.MANIFEST) == ["adasd_table1.md", "adasd_table2.md"]
    assert [line for line in stdout.splitlines() if line.startswith("== ")] == ["== adasd_table1 ==",
                                                                                "== adasd_table2 =="]
    assert report.main([str(res), "--table", "overview", "--out", str(out), "--format", "md"]) == 0
    assert sorted(p.name for p in out.iterdir() if p.name != report.MANIFEST) == ["overview.md"]
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("== ")] == ["== overview =="]


def test_stdout_is_the_tables_each_under_its_heading_with_wrapped_captions(tmp_path, capsys):
    res = runs_folder(tmp_path / "res")
    assert report.main([str(res), "--no-figures"]) == 0
    stdout = capsys.readouterr().out
    rep = report.build_report(load.timed(load.load_runs(res, full=True), "decode"))
    assert stdout == "".join(f"== {t.name} ==\n{t.markdown()}\n" for t in rep.tables)
    assert stdout.startswith("== overview ==\n**Runs: ") and "\n== adasd_table1 ==\n**AdaSD Table 1: " in stdout
    prose = [line for line in stdout.splitlines() if not line.startswith("|")]  # table rows are as wide as they are
    assert max(map(len, prose)) <= WIDTH and max(len(t.title) for t in rep.tables) > 2 * WIDTH
    assert "n_examples" not in stdout  # no dump of the runs table


def test_load_runs_gives_the_summary_columns_first_and_the_token_ids_on_request(tmp_path):
    rows = [{"id": "a", "new": 3, "s": 1.0}, {"id": "b", "new": 3, "s": 1.0}]
    for method, tokens in (("ar", [[1, 2, 3], [4, 5, 6]]), ("vanilla", [[1, 2, 3], [4, 9, 6]])):
        run = write_run(tmp_path, method, method, rows)
        full = [json.loads(line) for line in (run / "rows.jsonl").read_text().splitlines()]
        (run / "rows.jsonl").write_text("".join(json.dumps({**r, "token_ids": t, "top2_margins": [0.001] * 3}) + "\n"
                                                for r, t in zip(full, tokens)))
    runs, everything = load.load_runs(tmp_path), load.load_runs(tmp_path, full=True)
    assert list(runs.columns[:len(load.SUMMARY_COLUMNS)]) == load.SUMMARY_COLUMNS
    assert not set(load.FULL_COLUMNS) & set(runs.columns) and set(load.FULL_COLUMNS) <= set(everything.columns)
    assert set(everything.columns) == set(runs.columns) | set(load.FULL_COLUMNS)
    assert everything.set_index("method").loc["vanilla", "outputs"]["b"]["token_ids"] == [4, 9, 6]
    # the divergence table reads the token ids from the folders where the runs table lacks them: the same table
    found = [divergence.divergence_table(selection.groups(frame)[0]) for frame in (runs, everything)]
    assert found[0] is not None and found[1] is not None
    assert found[0].markdown() == found[1].markdown() and "vanilla · b | 1 | 5 | 9" in found[0].markdown()
    assert len(load.load_examples(str(tmp_path))) == 4  # a results folder, or the runs table
    assert sorted(load.where(runs, ["method=vanilla"])["method"]) == ["vanilla"]


@pytest.mark.parametrize("name", ["load_runs", "where", "load_examples", "SUMMARY_COLUMNS"])
def test_the_notebook_and_its_readme_use_the_code_names(name):
    """Every name of the analysis API the notebook calls or its README names is the code's."""
    notebook = (ROOT / "notebooks" / "analysis.ipynb").read_text()
    readme = (ROOT / "notebooks" / "README.md").read_text()
    assert f"load.{name}" in notebook and re.search(rf"`(load\.)?{name}`", readme) and hasattr(load, name)
    for called in ("report.build_report", "report.write_tables", "figures.make_figures", "table.heading()"):
        assert called in notebook
    assert "load_runs(RESULTS, full=True)" in notebook
