"""notebooks/analysis.ipynb runs top to bottom (nbclient) on a small results folder made here and
rebuilds the same tables and figures as the report library."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from helpers import ROOT, small
from specbench.analysis import load, report
from specbench.runs.runner import run


def test_analysis_notebook(tmp_path, monkeypatch):
    res, out = tmp_path / "results", tmp_path / "report"
    for m in ("vanilla", "adasd"):
        run(small(f"method={m}", "limit=2", "decode.max_new_tokens=16", "trace=true", "threads=1"), res / m)
    monkeypatch.setenv("SPECBENCH_RESULTS", str(res))
    monkeypatch.setenv("SPECBENCH_REPORT_OUT", str(out))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(ROOT / "notebooks" / "analysis.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()  # raises on a failing cell

    runs = load.load_runs(res)
    tables = report.build_tables(runs)
    assert [t.name for t in tables] == ["adasd_table1", "adasd_table2", "adasd_appendix_smoke"]
    for t in tables:  # the notebook wrote what the library builds
        assert (out / f"{t.name}.md").read_text() == t.markdown()
        assert (out / f"{t.name}.csv").read_text() == t.csv()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "fig_thresholds__tiny_random__smoke__adasd.png" in pngs and len(pngs) >= 6
    shown = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(shown) == len(pngs)  # every figure displayed inline


def test_the_readme_command_on_a_mixed_folder(tmp_path):
    """notebooks/README.md's own command, run from a checkout's root, on greedy and sampled runs."""
    for m in ("vanilla", "adasd"):
        for decode in ("greedy", "t1"):
            run(small(f"method={m}", f"decode={decode}", "limit=2", "decode.max_new_tokens=8", "threads=1"),
                tmp_path / "results" / m / decode)
    (tmp_path / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / "analysis.ipynb", tmp_path / "notebooks")
    readme = (ROOT / "notebooks" / "README.md").read_text()
    (command,) = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}  # as activated
    done = subprocess.run(["bash", "-e", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    written = sorted(p.name for p in (tmp_path / "results" / "_report").iterdir())
    assert "adasd_table1__greedy.md" in written and "adasd_table1__t1.md" in written

    # the command leaves the executed notebook, with its outputs, where the README says to open it
    (output,) = re.findall(r"jupyter execute \S+ .*--output=(\S+)", command)  # relative to the notebook's folder
    executed = (tmp_path / "notebooks" / output).with_suffix(".ipynb").resolve()
    assert f"`{executed.relative_to(tmp_path)}`" in readme and executed.is_file(), written
    code = [c for c in nbformat.read(executed, as_version=4).cells if c.cell_type == "code"]
    outputs = [o for c in code for o in c.outputs]
    assert all(c.execution_count for c in code) and not [o for o in outputs if o.output_type == "error"]
    assert any("tables," in o.get("text", "") for o in outputs)  # the cell that writes the tables printed its count
    shown = [o.data["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {})]
    tables = report.build_report(load.load_runs(tmp_path / "results")).tables
    assert len(tables) >= 2 and all(t.markdown() in shown for t in tables)  # every table shown inline
