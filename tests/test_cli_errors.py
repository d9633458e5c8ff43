"""Errors seen from outside: `python run.py` answers bad input and a broken set-up (a read-only or full results
folder, a plugin file that does not import) with its message alone, no traceback on stderr, and leaves nothing
half-written; a run that takes a folder's lock removes the temporary files of writers killed before their rename."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from helpers import CONF, ROOT, compose_cfg, small
from specbench.decoding.compose import method_label
from specbench.common.errors import UserError
from specbench.common.files import remove_temporaries, temporary_sibling
from specbench.common.options import OptionError
from specbench.runs.results import PENDING, ROWS, read_rows
from specbench.runs.runner import build_method, run

SETTINGS = ("dataset=smoke", "limit=2", "decode.max_new_tokens=4", "warmup=0", "threads=1", "progress=false")
TINY_RUN = ("pair=tiny_random", *SETTINGS)

# python -c: set something up in the process, then run run.py with the remaining arguments
THEN_RUN_PY = """
import runpy, sys
{setup}
sys.argv[0] = "run.py"
runpy.run_path("run.py", run_name="__main__")
"""


def run_py(*args: str, setup: str | None = None, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """run.py with `args` (after `setup`, Python run in the same process first; under the command `prefix`)."""
    entry = ["-c", THEN_RUN_PY.format(setup=setup)] if setup else ["run.py"]
    return subprocess.run([*prefix, sys.executable, *entry, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def message_alone(p: subprocess.CompletedProcess, *says: str) -> None:
    """The run failed with a message saying each of `says` and no Python traceback (logging's included)."""
    assert p.returncode != 0, p.stdout[-2000:]
    assert "Traceback" not in p.stderr and "Logging error" not in p.stderr, p.stderr
    for s in says:
        assert s in p.stderr, p.stderr


def leaves_nothing(root: Path) -> None:
    """No folder below the results root (a run refused before its first row leaves none)."""
    assert not root.exists() or list(root.iterdir()) == [], sorted(root.rglob("*"))


# ---------------------------------------------------------------- crash debris

def test_a_run_removes_the_temporary_files_killed_writers_left_and_nothing_else(tmp_path):
    folder, other = tmp_path / "run", tmp_path / "other"
    run(small("limit=2", "decode.max_new_tokens=4"), folder)
    rows = (folder / ROWS).read_bytes()
    debris = [temporary_sibling(folder / name) for name in ("summary.json", "config.json", PENDING)]
    debris.append(temporary_sibling(folder / "traces" / "smoke-00.parquet"))
    debris.append(temporary_sibling(folder / "drafter"))  # a folder of atomic_folder
    kept = [folder / ".notes.tmp", folder / f"keep.{'a' * 32}.tmp", folder / f".x.{'a' * 31}.tmp",
            folder / f".x.{'A' * 32}.tmp", other / temporary_sibling(folder / "summary.json").name,
            folder / "nested" / temporary_sibling(folder / "summary.json").name]  # another folder's, maybe in use
    for path in debris[:-1] + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    debris[-1].mkdir()
    (debris[-1] / "model.safetensors").write_text("x")
    summary = run(small("limit=2", "decode.max_new_tokens=4"), folder)  # resumes: the one writer of the folder now
    assert not any(p.exists() for p in debris) and all(p.read_text() == "x" for p in kept)
    assert (folder / ROWS).read_bytes() == rows and (summary["decoded"], summary["resumed"]) == (0, 2)
    assert remove_temporaries(folder) == []


# ---------------------------------------------------------------- bad input, from the command line

BAD_INPUT = [  # overrides, what the message says
    (("shard=3/2",), "shard=3/2: need 0 <= i < n in shard=i/n"),
    (("shard=1/0",), "shard=1/0: need 0 <= i < n in shard=i/n"),
    (("stop_strings=['']",), "stop_strings must be a list of non-empty strings"),
    (("dataset=local_prompts", f"dataset.path={ROOT / 'tests' / 'data' / 'prompts.jsonl'}",
      "dataset.stop_strings=['x','']"), "dataset.stop_strings must be a list of non-empty strings"),
    (("pair.target.max_position_embeddings=24",),
     "example 'smoke-00' of dataset 'smoke': the prompt has 28 tokens but the model context is 24"),
    (("method=confidence", "method.threshold=1.5"),
     "method.threshold must be a finite number in [0, 1], got 1.5 (method 'confidence')"),
]


@pytest.mark.parametrize("overrides,says", BAD_INPUT, ids=[o[-1] for o, _ in BAD_INPUT])
def test_bad_input_is_a_user_error_and_leaves_no_folder(tmp_path, overrides, says):
    """A UserError is what run.py shows as its message alone (the command line: the test below)."""
    with pytest.raises(UserError) as err:
        run(small("limit=2", "decode.max_new_tokens=4", *overrides), tmp_path / "run")
    assert says in str(err.value) and not (tmp_path / "run").exists()


def test_bad_input_on_the_command_line_gives_its_message_alone_and_leaves_no_folder(tmp_path):
    """One subprocess for the cases above: they share the path from the runner's UserError to stderr."""
    p = run_py(*TINY_RUN, "shard=3/2", f"paths.results={tmp_path / 'results'}")
    message_alone(p, "shard=3/2: need 0 <= i < n in shard=i/n")
    leaves_nothing(tmp_path / "results")


def test_a_pair_whose_vocabularies_differ(tmp_path):
    from specbench.models.pairs import BUILDERS

    cross = BUILDERS.get("tiny_cross")(yaml.safe_load((CONF / "pair" / "tiny_cross.yaml").read_text()),
                                       torch.device("cpu"))
    for folder, model, tok in ((tmp_path / "t", cross.target, cross.tokenizer),
                               (tmp_path / "d", cross.draft, cross.draft_tokenizer)):
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
    p = run_py(*SETTINGS, "pair=qwen25coder_1p5b_smollm2_135m", "pair.cross_tokenizer=false",
               f"pair.target.path={tmp_path / 't'}", f"pair.draft.path={tmp_path / 'd'}",
               f"paths.results={tmp_path / 'results'}")
    message_alone(p, f"target '{tmp_path / 't'}' (vocabulary 259) and draft '{tmp_path / 'd'}' (vocabulary 259) do "
                     "not share a tokenizer vocabulary", "pair.cross_tokenizer=true")
    leaves_nothing(tmp_path / "results")


def test_a_method_plugin_with_a_syntax_error_names_its_file_and_line(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "broken_method.py").write_text('"""A method with a typo."""\n\nx = 1\ndef f(:\n    pass\n')
    setup = f"import specbench.methods\nspecbench.methods.__path__.append({str(plugins)!r})"
    p = run_py(*TINY_RUN, f"paths.results={tmp_path / 'results'}", setup=setup)
    message_alone(p, f"{plugins / 'broken_method.py'}, line 4: SyntaxError: ", "\n    def f(:\n",
                  "specbench.methods.broken_method cannot be imported")
    leaves_nothing(tmp_path / "results")


METHOD_OPTIONS = [  # method options out of range or in conflict: each names its key (and the method)
    ({"name": "confidence", "threshold": 1.5}, "method.threshold must be a finite number in [0, 1]"),
    ({"name": "adasd", "parts": {"rule": "greedy2"}}, "method.parts.rule must be one of sample_match, rejection"),
    ({"name": "adasd_gen_only", "fixed_t_v": 0.1}, "method.fixed_t_v must be null"),
    ({"name": "adasd", "fixed_t_v": 1.5}, "method.fixed_t_v must be a finite number in [0, 1] or null"),
    ({"name": "gammatune", "gamma_min": 5, "gamma_max": 3}, "method.gamma_min must be <= method.gamma_max"),
    ({"name": "gammatune", "eta": 0.0}, "method.eta must be a finite number in (0, 1]"),
    ({"name": "gammatune", "delta": -1}, "method.delta must be an integer >= 0"),
    ({"name": "gammatune_plus", "tau": 1.5}, "method.tau must be a finite number in [0, 1]"),
    ({"name": "hf_assisted", "prompt_lookup_num_tokens": 3, "assistant_early_exit": 2},
     "method.prompt_lookup_num_tokens and method.assistant_early_exit choose two"),
    ({"name": "hf_assisted", "max_matching_ngram_size": 3}, "method.max_matching_ngram_size applies to prompt lookup"),
    ({"name": "hf_assisted", "num_assistant_tokens_schedule": "often"},
     "method.num_assistant_tokens_schedule must be one of constant, heuristic, heuristic_transient"),
    ({"name": "hf_assisted", "assistant_confidence_threshold": -0.5},
     "method.assistant_confidence_threshold must be a finite number in [0, 1]"),
]


@pytest.mark.parametrize("options,says", METHOD_OPTIONS, ids=[s.split(" ")[0] for _, s in METHOD_OPTIONS])
def test_method_option_ranges_are_option_errors_naming_the_key(options, says):
    with pytest.raises(OptionError) as err:
        build_method(options)
    label = method_label(options)  # the method's name, with each part that differs from its preset's
    assert str(err.value).startswith(says) and str(err.value).endswith(f"(method {label!r})"), err.value


# ---------------------------------------------------------------- a results folder that cannot be written

def read_only(folder: Path) -> tuple[str, ...]:
    """The command prefix under which `folder` is read-only (root: a read-only bind mount in its own namespace)."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return ()
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("running as root without a mount namespace to make a read-only folder in")
    mount = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"'
    return "unshare", "-m", "sh", "-c", mount, str(folder)


def test_a_read_only_results_folder(tmp_path):
    root = tmp_path / "results"
    root.mkdir()
    try:
        p = run_py(*TINY_RUN, f"paths.results={root}", prefix=read_only(root))
    finally:
        root.chmod(0o755)
    message_alone(p, f"{root}: cannot write {root}/tiny_random/smoke/vanilla/greedy/",
                  "make the folder writable, or write to one this user may write (a run: paths.results=...)")
    leaves_nothing(root)


FULL_DISK = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import specbench.common.files as files
from helpers import full_disk_on_append

files.open = full_disk_on_append(2, 1 / 2)  # the second row's append writes half of it, then the disk is full
"""


def test_a_full_disk_keeps_whole_rows_and_the_rerun_resumes(tmp_path):
    root, args = tmp_path / "results", (*TINY_RUN, "limit=3", f"paths.results={tmp_path / 'results'}")
    p = run_py(*args, setup=FULL_DISK)
    folder = next(root.rglob(ROWS)).parent
    message_alone(p, f"{folder}: cannot write (No space left on device): the disk (or quota) is full",
                  "rerun the same command (a run resumes")
    assert [r["id"] for r in read_rows(folder / ROWS)] == ["smoke-00"] and not (folder / PENDING).exists()
    assert len((folder / ROWS).read_text().splitlines()) == 1  # the half-written row is cut off
    summary = run(compose_cfg(*args), folder)  # the same command again, in this process
    assert (summary["decoded"], summary["resumed"]) == (2, 1)
    assert [r["id"] for r in read_rows(folder / ROWS)] == ["smoke-00", "smoke-01", "smoke-02"]


def test_a_folder_of_another_configuration_or_code_version_is_refused_as_a_user_error(tmp_path):
    """The runner's refusals of a folder (another run identity, rows of another git hash) are user errors: their
    message alone on the command line, naming the folder and what to do; the folder's rows are left as they are."""
    folder = tmp_path / "run"
    run(compose_cfg(*TINY_RUN, "limit=1"), folder)
    rows = (folder / ROWS).read_bytes()
    with pytest.raises(UserError, match=r"holds results of a different configuration.*decode.seed"):
        run(compose_cfg(*TINY_RUN, "limit=1", "decode.seed=5"), folder)
    record = folder / "config.json"
    saved = record.read_text()
    record.write_text(saved.replace('"git_hash": "', '"git_hash": "0000000'))
    with pytest.raises(UserError, match=r"refusing to mix rows of different code versions.*resume_any_version=true"):
        run(compose_cfg(*TINY_RUN, "limit=2"), folder)  # a row to add
    assert (folder / ROWS).read_bytes() == rows
