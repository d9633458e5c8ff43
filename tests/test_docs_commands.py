"""Every command in the README and the guides (docs/*.md) runs here, shrunk: each `python run.py` job composes and
passes the run's own checks (through the dry run, which also expands sweeps and experiments); a job this machine
can run (a CPU pair, the bench task, nothing lacking) runs for real on one example of 4 new tokens; the report
commands run on those runs; `--help` lines print; the bench and merge lines parse. Install and set-up lines are
CI's own steps (tests/test_docs_setup.py) or need a network or a GPU node, named in NOT_RUN."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, compose_cfg

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHRINK = ["limit=1", "decode.max_new_tokens=4", "warmup=0", "threads=1", "progress=false"]
# Lines not run: installs and set-up (CI runs the README's), downloads (no network), the CUDA lane (a GPU), the test
# command itself, copying the per-machine example, and torchrun (tests/test_train_processes.py runs it).
NOT_RUN = ("pip ", "python -m pip ", "python -m venv ", "git clone ", "hf download ", "export ", "cp conf/local/",
           "python -m pytest ", "SPECBENCH_TEST_DEVICE=cuda ", "torchrun ")
PLACEHOLDER = re.compile(r"<[^<>\s]+>")


def doc_commands() -> list[tuple[str, str]]:
    """(file name, command) of every line of every ```bash block, comments and blank lines left out."""
    out = []
    for path in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S):
            for line in block.splitlines():
                command = line.split("  #")[0].split(" # ")[0].strip()
                if command and not command.startswith("#"):
                    out.append((path.name, command))
    return out


def argv(command: str) -> list[str]:
    """The command's words as the shell gives them: environment assignments, `nohup`, redirections and a trailing
    `&` left out, `<placeholders>` filled, `$(...)` expanded by bash."""
    command = PLACEHOLDER.sub("placeholder", command)
    command = re.sub(r"\s+(>\s*\S+|2>&1|&)(?=\s|$)", " ", command).strip()
    words = shlex.split(command)
    while words and (re.fullmatch(r"[A-Z_]+=\S*", words[0]) or words[0] == "nohup"):
        words = words[1:]
    if "$(" in command:
        printed = subprocess.run(["bash", "-c", f"printf '%s\\0' {shlex.join(words[:2])} {command.split(None, 2)[2]}"],
                                 capture_output=True, text=True, check=True).stdout
        words = printed.rstrip("\0").split("\0")
    return words


COMMANDS = [(f, c) for f, c in doc_commands() if not c.startswith(NOT_RUN)]
CHECKED: set[tuple[str, ...]] = set()  # jobs whose checks passed in this process
SEEN: dict[str, str | None] = {}  # the dry run's datasets read in this process
RUN_PY = [(f, argv(c)[2:]) for f, c in COMMANDS if argv(c)[:2] == ["python", "run.py"]]


def test_every_documented_command_is_run_or_named_as_not_run():
    kinds = ("python run.py", *(f"python -m specbench.{m}" for m in ("report", "bench", "runs.merge")))
    for name, command in COMMANDS:
        assert " ".join(argv(command)).startswith(kinds), f"{name}: {command}"
    assert len(RUN_PY) >= 30 and any(f == "README.md" for f, _ in RUN_PY)


def test_help_lines_print_what_they_promise():
    sys.path.insert(0, str(ROOT))
    import run

    for _, args in RUN_PY:
        if "--help" in args:
            text = run.brief_help(args)
            assert not text.startswith("unknown") and ("method=NAME:" in text or "parts" in text), args


@pytest.mark.parametrize("name,args", [a for a in RUN_PY if "--help" not in a[1]],
                         ids=lambda x: x if isinstance(x, str) else " ".join(x)[:60])
def test_documented_run_commands_compose_and_pass_their_checks(name, args, tmp_path):
    """Every job of the command (a sweep's, an experiment's) composes, gets its folder and passes the runner's checks;
    what a job lacks here (hub weights, a trained drafter, a hub dataset, GPUs) is allowed, a config error is not."""
    from specbench.runs import dryrun
    from specbench.runs.overrides import check_option_overrides

    words = check_option_overrides([a for a in args if a != "--dry-run"])
    for job in dryrun.jobs(words):
        if tuple(job) in CHECKED:  # the same job of a command another guide repeats
            continue
        check = dryrun.check_job([*job, f"paths.results={tmp_path}"], SEEN)
        assert check.folder is not None and str(check.folder).startswith(str(tmp_path)), (name, job)
        assert not [x for x in check.lacks if x.startswith("config:")], (name, job, check.lacks)
        CHECKED.add(tuple(job))


def shrunk(args: list[str]) -> list[str]:
    """The command's overrides with SHRINK's keys set to SHRINK's values (in its place, not beside it)."""
    keys = {o.split("=", 1)[0] for o in SHRINK}
    return [a for a in args if a.split("=", 1)[0].lstrip("+") not in keys] + SHRINK


def runnable(job: list[str]) -> bool:
    """A job this CPU runs in a test: a pair built here (not from the hub), the bench task, no logger."""
    cfg = compose_cfg(*job)
    return cfg.pair.builder != "hub" and cfg.task.name == "bench" and cfg.logger.get("name", "none") == "none"


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> tuple:
    """Every job of the documented run.py commands that this CPU can run, run on one example into one results
    folder (as the docs' commands share results/); the folders written."""
    from specbench.runs import dryrun
    from specbench.runs.layout import job_dir
    from specbench.runs.overrides import check_option_overrides
    from specbench.runs.runner import run

    root = tmp_path_factory.mktemp("results")
    folders, seen = set(), {}
    for _, args in RUN_PY:
        if "--help" in args or "--dry-run" in args:
            continue
        for job in dryrun.jobs(check_option_overrides([*shrunk(args), f"paths.results={root}"])):
            if runnable(job) and not dryrun.check_job(job, seen).lacks:
                cfg = compose_cfg(*job)
                folder = job_dir(cfg)
                if folder not in folders:
                    run(cfg, folder)
                    folders.add(folder)
    return root, folders


def test_documented_run_commands_run_shrunk(ran):
    root, folders = ran
    assert len(folders) >= 10  # the quick start, the comparisons, the compositions, the trees
    for folder in folders:
        assert (folder / "summary.json").is_file() and (folder / "rows.jsonl").read_text().count("\n") == 1, folder
    methods = {f.relative_to(root).parts[2] for f in folders}
    assert {"ar", "vanilla", "gammatune+drafter=lookup", "vanilla+drafter=suffix", "spec_tree"} <= methods


def test_documented_bench_and_merge_lines_parse():
    from specbench.bench.cli import parser

    for name, command in COMMANDS:
        words = argv(command)
        if words[:3] == ["python", "-m", "specbench.bench"]:
            parser().parse_args(words[3:])  # argparse exits (SystemExit 2) on an unknown subcommand or flag
        elif words[:3] == ["python", "-m", "specbench.runs.merge"]:
            assert len(words) == 4 and words[3].startswith("results/"), (name, command)


def test_the_readmes_add_a_method_example_runs_and_is_lossless(tmp_path):
    """The README's methods/margin_stop.py, its conf as the README describes it, run greedy on one example: the
    target's greedy tokens, as ar decodes them (the method is lossless)."""
    code = re.search(r"```python\n# methods/margin_stop.py\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert code, "README.md: the add-a-method example"
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "margin_stop.py").write_text(code.group(1))  # methods/margin_stop.py, outside the clone
    script = f"""
import json, sys
import specbench.methods
specbench.methods.__path__.append(sys.argv[1] + "/plugins")
import specbench.methods.margin_stop
from specbench.common.configs import compose_config
from specbench.runs.runner import run
common = ["pair=tiny_random", "dataset=smoke", {', '.join(map(repr, SHRINK))}]
method = ["++method.name=margin_stop", "++method.parts={{policy: margin_stop, drafter: draft_model, shape: chain, "
          "rule: rejection}}", "++method.gamma=5", "++method.margin=0.2"]
a = run(compose_config([*common, "method=ar"], hydra=True), sys.argv[1] + "/ar")
m = run(compose_config([*common, "method=vanilla", *method], hydra=True), sys.argv[1] + "/m")
rows = [json.loads(open(sys.argv[1] + f"/{{k}}/rows.jsonl").readline()) for k in ("ar", "m")]
print(json.dumps([m["method"], rows[0]["token_ids"], rows[1]["token_ids"]]))
"""
    p = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    import json

    method, ar_tokens, tokens = json.loads(p.stdout.strip().splitlines()[-1])
    assert method == "margin_stop" and tokens == ar_tokens and len(tokens) == 4


def test_documented_report_commands_run_on_the_documented_runs(ran, tmp_path):
    """Each `python -m specbench.report` line on the runs above (`results/` read as their folder): every table it can
    build, or for a `--table` its runs lack, exit 1 with why and the runs to add; a pair folder nobody ran: exit 2."""
    root, _ = ran
    lines = [argv(c)[3:] for _, c in COMMANDS if argv(c)[:3] == ["python", "-m", "specbench.report"]]
    assert len(lines) >= 4
    for args in lines:
        args = [str(root) + a[len("results"):] if a.startswith("results") and a != "results/_report" else
                str(tmp_path / "_report") if a == "results/_report" else a for a in args]
        p = subprocess.run([sys.executable, "-m", "specbench.report", *args], cwd=ROOT, capture_output=True, text=True,
                           timeout=600)
        if args == ["--help"]:
            assert p.returncode == 0 and "--table" in p.stdout
        elif not Path(args[0]).exists():  # e.g. results/llama70b_8b: no such run here
            assert p.returncode == 2 and "does not exist" in p.stderr, (args, p.stderr[-2000:])
        elif "--table" in args and p.returncode == 1:
            assert "not built" in p.stderr and "python run.py" in p.stderr, (args, p.stderr[-2000:])
        elif "--table" in args:  # what it names, no overview
            assert p.returncode == 0 and p.stdout.startswith("== ") and "== overview" not in p.stdout, args
        else:
            assert p.returncode == 0 and p.stdout.startswith("== overview"), (args, p.stderr[-2000:])
