"""A hub pair whose weights are not here fails at once with one clear message per job, and a sweep ends with
every failed job's error: the cache is checked before any download, the hub is asked once without retries.
A hub dataset follows the same policy through the same function (hub.ask_hub)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import datasets
import pytest
import torch
from huggingface_hub import constants as hf_constants
from omegaconf import OmegaConf

import specbench.data.sources as data
from helpers import ROOT, compose_cfg
from specbench.evaluators import gsm8k
from specbench.common import hub
from specbench.models import pairs
from specbench.runs.sweep import summary

MISSING = "specbench-test/missing-7b"
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, a connection is refused at once


def pair_cfg(*overrides: str) -> dict:
    return OmegaConf.to_container(compose_cfg(*overrides).pair, resolve=True)


@pytest.fixture
def online(monkeypatch, tmp_path):
    """The hub not marked offline, no earlier answer remembered, empty local caches (the hub cache and the datasets
    cache) and a count of the requests made to the hub (the repository ids asked about)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(hub, "_HUB_DOWN", {})
    asked: list[str] = []
    real = hub.HfApi.repo_info

    def counted(self, repo_id, **kwargs):
        asked.append(repo_id)
        return real(self, repo_id, **kwargs)

    monkeypatch.setattr(hub.HfApi, "repo_info", counted)
    return asked


@pytest.fixture
def no_download(monkeypatch):
    """from_pretrained must not be reached for a model that cannot be loaded."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"from_pretrained called with {args} {kwargs}")

    monkeypatch.setattr(pairs.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(pairs.AutoTokenizer, "from_pretrained", refuse)


# huggingface_hub's own request for its agent registry (at most once a day, kept under HF_HOME), not specbench's
REGISTRY = "/api/agent-harnesses"


class Hub(BaseHTTPRequestHandler):
    """A stand-in hub API: /api/models/<id> and /api/datasets/<id> answer 200 for org/there, 403 gated for
    org/gated, else 404; the paths asked for (but REGISTRY) are kept in `paths`."""

    paths: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path.split("?")[0] != REGISTRY:
            self.paths.append(self.path.split("?")[0])
        repo = self.path.split("?")[0].removeprefix("/api/models/").removeprefix("/api/datasets/")
        status, headers = {"org/there": (200, {}), "org/gated": (403, {"X-Error-Code": "GatedRepo"})}.get(
            repo, (404, {"X-Error-Code": "RepoNotFound"}))
        body = json.dumps({"id": repo} if status == 200 else {"error": "no"}).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_hub(monkeypatch, online):
    """A local HTTP server answering as the hub's model API; the requests to it are counted in `online`."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    monkeypatch.setattr(Hub, "paths", [])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(hf_constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    yield online
    server.shutdown()


@pytest.fixture
def hanging_up():
    """A hub that reads each request and hangs up unanswered (an unreachable hub that counts the requests made to
    it): yields (its endpoint, the paths asked for, one per connection, huggingface_hub's REGISTRY left out)."""
    listener, stop = socket.create_server(("127.0.0.1", 0)), threading.Event()
    listener.settimeout(0.1)  # to see `stop`
    asked: list[str] = []

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10)
                request = conn.recv(65536).decode(errors="replace").split(" ")  # GET <path> HTTP/1.1 ...
            path = request[1].split("?")[0] if len(request) > 1 else "(no request)"
            if path != REGISTRY:
                asked.append(path)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", asked
    stop.set()
    thread.join()
    listener.close()


def test_offline_pair_fails_without_asking_the_hub_and_says_what_it_needs(online, no_download):
    with pytest.raises(hub.ModelUnavailable) as err:
        with pytest.MonkeyPatch.context() as m:
            m.setenv("HF_HUB_OFFLINE", "1")
            pairs.build_hub(pair_cfg("pair=llama70b_8b"), torch.device("cpu"))
    text = str(err.value)
    assert online == []  # offline: no request at all
    assert "meta-llama/Llama-3.1-70B (revision main) is not in the local Hugging Face cache" in text
    assert "HF_HUB_OFFLINE is set" in text
    assert "  hf download meta-llama/Llama-3.1-70B\n  hf download meta-llama/Llama-3.1-8B\n" in text
    assert "licence accepted on the model page (https://huggingface.co/meta-llama/Llama-3.1-70B" in text
    assert "`hf auth login` or HF_TOKEN=<token>" in text and "copy its Hugging Face cache" in text
    assert ("target meta-llama/Llama-3.1-70B: 70.6 B parameters x 2 bytes (bfloat16) = 141.2 GB: more than one "
            "80 GB GPU holds, so device_map: auto over several GPUs (set)") in text
    assert "draft meta-llama/Llama-3.1-8B: 8.03 B parameters x 2 bytes (bfloat16) = 16.1 GB (fits one GPU)" in text
    assert "together: 157.3 GB" in text


def test_needs_count_quantized_bytes_and_ask_for_device_map_when_missing():
    cfg = pair_cfg("pair=llama70bi_8bi_int8")
    assert "70.6 B parameters x 1 bytes (int8) = 70.6 GB (fits one GPU)" in pairs.pair_needs(cfg)
    cfg = pair_cfg("pair=qwen72b_7b", "pair.target.device_map=null")
    assert "device_map: auto over several GPUs (add pair.target.device_map=auto)" in pairs.pair_needs(cfg)


def test_every_hub_pair_records_its_size():
    for f in sorted((ROOT / "conf" / "pair").glob("*.yaml")):
        cfg = pair_cfg(f"pair={f.stem}")
        if cfg.get("builder") == "hub":
            assert all(cfg[r]["params_b"] > 0 for r in ("target", "draft") if cfg.get(r)), f.name


def test_an_unreachable_hub_is_asked_once_without_retries(online, no_download, monkeypatch):
    monkeypatch.setattr(hf_constants, "ENDPOINT", UNREACHABLE)
    cfg = pair_cfg("pair=qwen25coder_1p5b_0p5b", f"pair.target.path={MISSING}", "pair.draft.path=specbench-test/missing-1b")
    for _ in range(2):  # two jobs of a sweep in one process
        with pytest.raises(hub.ModelUnavailable) as err:
            pairs.build_hub(cfg, torch.device("cpu"))
        assert f"hf download {MISSING}" in str(err.value) and "hf download specbench-test/missing-1b" in str(err.value)
        assert f"the hub ({UNREACHABLE}) is unreachable" in str(err.value)
    assert online == [MISSING]  # one request in all: the hub is not asked again once found unreachable


def test_gated_and_missing_models_say_why(fake_hub, no_download):
    with pytest.raises(hub.ModelUnavailable, match="(?s)org/gated .*gated and this account has not accepted its "
                                                     "licence.*hf download org/gated.*HF_TOKEN"):
        pairs.load_model({"path": "org/gated"}, torch.device("cpu"))
    with pytest.raises(hub.ModelUnavailable, match=r"org/nothing \(revision main\) is not in the local .*, and the hub has no such model"):
        pairs.load_tokenizer("org/nothing")
    assert fake_hub == ["org/gated", "org/nothing"]


def test_a_reachable_hub_downloads_and_a_cached_model_loads_without_it(fake_hub, monkeypatch, tmp_path):
    assert hub.hub_source("org/there") == "hub"  # not cached, the hub has it: from_pretrained downloads
    snapshot = tmp_path / "models--org--cached" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--org--cached" / "refs").mkdir()
    (tmp_path / "models--org--cached" / "refs" / "main").write_text("abc")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    assert hub.hub_source("org/cached") == "cache"  # the hub does not have it, the cache does
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    assert hub.hub_source("org/cached") == "cache" and fake_hub == ["org/there", "org/cached"]
    assert hub.hub_source(str(tmp_path)) == "local"


def test_download_command_follows_the_installed_huggingface_hub(monkeypatch):
    assert hub.download_command("a/b", "v1") == "hf download a/b --revision v1"  # huggingface_hub 2.x here
    assert hub.download_command("a/b", None, "dataset") == "hf download --repo-type dataset a/b"
    monkeypatch.setattr(hub.huggingface_hub, "__version__", "0.30.2")  # before the `hf` CLI
    assert hub.download_command("a/b") == "huggingface-cli download a/b"
    assert "`huggingface-cli login`" in hub.access_hints(["a/b"])


# ---------------------------------------------------------------- hub datasets: the models' policy

def test_a_model_and_a_dataset_ask_the_hub_through_one_function(fake_hub, no_download, monkeypatch):
    calls = []
    real = hub.ask_hub
    monkeypatch.setattr(hub, "ask_hub", lambda *args: calls.append(args) or real(*args))
    with pytest.raises(hub.ModelUnavailable, match="the hub has no such model"):
        pairs.load_tokenizer("org/nothing")
    with pytest.raises(data.HubSetUnavailable) as err:
        data.load_source(data.Source("a set", hub="org/nothing", hub_split="test"), None)
    assert "org/nothing (revision main) is not in the local Hugging Face cache" in str(err.value)
    assert "and the hub has no such dataset" in str(err.value)
    assert "\n  hf download --repo-type dataset org/nothing\nThis set has no local copy" in str(err.value)
    with pytest.raises(data.HubSetUnavailable, match="(?s)org/gated .*gated and this account has not accepted"):
        data.load_hub("json", None, "train", "hf://datasets/org/gated/data/rows.json")  # the set of a data file
    assert calls == [("org/nothing", None, "model"), ("org/nothing", None, "dataset"), ("org/gated", None, "dataset")]
    assert Hub.paths == ["/api/models/org/nothing", "/api/datasets/org/nothing", "/api/datasets/org/gated"]
    assert fake_hub == ["org/nothing", "org/nothing", "org/gated"]  # one request each


def test_an_unreachable_hub_fails_a_hub_dataset_after_one_request(online, no_download, monkeypatch, caplog):
    """A refused connection: what datasets.load_dataset retried 5 times (about 23 s)."""
    monkeypatch.setattr(hf_constants, "ENDPOINT", UNREACHABLE)
    for _ in range(2):  # two jobs of a sweep in one process
        with pytest.raises(data.HubSetUnavailable) as err:
            data.load_source(gsm8k.TEST, None)
        text = str(err.value)
        assert text.startswith("GSM8K test: could not load openai/gsm8k (config main, split test) from the Hugging "
                               "Face hub: openai/gsm8k (revision main) is not in the local Hugging Face cache")
        assert f"the hub ({UNREACHABLE}) is unreachable" in text
        assert text.endswith("\n  hf download --repo-type dataset openai/gsm8k\nOr set dataset.data_dir / "
                             "$SPECBENCH_DATA_DIR to a folder holding gsm8k/test.jsonl")
    with pytest.raises(hub.ModelUnavailable, match=f"the hub \\({UNREACHABLE}\\) is unreachable"):
        pairs.load_tokenizer(MISSING)  # a model after the datasets: the hub found unreachable is not asked again
    assert online == ["openai/gsm8k"] and "Retrying" not in caplog.text  # one request in all, no retries


def cached_set(cache: Path) -> Path:
    """The hub set org/tiny (config main, split test: two rows) as `hf download --repo-type dataset` leaves it."""
    snapshot = cache / "datasets--org--tiny" / "snapshots" / "abc"
    (snapshot / "main").mkdir(parents=True)
    (snapshot / "README.md").write_text("---\nconfigs:\n- config_name: main\n  data_files:\n  - split: test\n"
                                        "    path: main/test.jsonl\n---\n")
    (snapshot / "main" / "test.jsonl").write_text('{"q": "a"}\n{"q": "b"}\n')
    (cache / "datasets--org--tiny" / "refs").mkdir()
    (cache / "datasets--org--tiny" / "refs" / "main").write_text("abc")
    return snapshot


def test_a_hub_dataset_in_the_local_cache_loads_without_the_hub(online, monkeypatch):
    cached_set(Path(hf_constants.HF_HUB_CACHE))
    monkeypatch.setattr(hf_constants, "ENDPOINT", UNREACHABLE)
    tiny = data.Source("tiny", hub="org/tiny", hub_config="main", hub_split="test")
    assert [r["q"] for r in data.load_source(tiny, None)] == ["a", "b"]
    rows = data.load_hub("json", None, "train", "hf://datasets/org/tiny/main/test.jsonl")  # a file of the set
    assert [r["q"] for r in rows] == ["a", "b"]
    with pytest.raises(data.HubSetUnavailable, match="(?s)config other.*BuilderConfig 'other' not found.*"
                                                     "hf download --repo-type dataset org/tiny"):
        data.load_source(data.Source("tiny", hub="org/tiny", hub_config="other", hub_split="test"), None)
    assert online == ["org/tiny"]  # asked once: the hub found unreachable is remembered
    monkeypatch.setattr(hub, "_HUB_DOWN", {})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert [r["q"] for r in data.load_source(tiny, None)] == ["a", "b"] and online == ["org/tiny"]  # no request


@pytest.mark.parametrize("hub_kind", ["refusing", "hanging_up"])
def test_a_sweep_on_an_unreachable_hub_dataset_fails_after_one_request(tmp_path, hanging_up, hub_kind):
    """A hub that refuses connections (what datasets retried), or one that hangs up and counts every request."""
    endpoint, requests = hanging_up if hub_kind == "hanging_up" else (UNREACHABLE, None)
    p = run_py(tmp_path / "results", "-m", "method=ar,vanilla", "pair=tiny_random", "dataset=gsm8k",
               "dataset.data_dir=null", "limit=1", env={"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf")})
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "Retrying" not in out and "Traceback" not in out
    assert out.count("asking ") == 1 and requests in (None, ["/api/datasets/openai/gsm8k"])  # one in the sweep
    report = out[out.index("sweep: 2 of 2 jobs failed"):]
    assert "the same error as #0" in report and f"the hub ({endpoint}) is unreachable" in report
    assert "  hf download --repo-type dataset openai/gsm8k\n" in report and "$SPECBENCH_DATA_DIR" in report


def test_a_repeated_error_is_shown_once_in_the_summary():
    text = summary([("#0 method=ar", "boom\nline 2"), ("#1 method=vanilla", "boom\nline 2"), ("#2 x", "other")], 4)
    assert text.splitlines() == ["sweep: 3 of 4 jobs failed (a kept job folder's log file holds its traceback):",
                                 "#0 method=ar", "    boom", "    line 2", "#1 method=vanilla",
                                 "    the same error as #0", "#2 x", "    other"]


# ---------------------------------------------------------------- run.py: the headline command's shape

def run_py(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_ENDPOINT", "HYDRA_FULL_ERROR")}
    return subprocess.run([sys.executable, "run.py", *args, "threads=1", f"paths.results={tmp_path}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**base, **env})


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": UNREACHABLE}], ids=["offline", "unreachable"])
def test_a_sweep_on_a_missing_model_reports_every_job(tmp_path, env):
    for job in ("0", "1"):  # a folder holding something else is kept: its log shows the job's error
        (tmp_path / job).mkdir()
        (tmp_path / job / "notes.txt").write_text("kept")
    p = run_py(tmp_path, "-m", "method=ar,vanilla", "pair=qwen25coder_1p5b_0p5b", f"pair.target.path={MISSING}",
               f"hydra.sweep.subdir={tmp_path}/${{hydra.job.num}}", env=env)
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert "Retrying" not in out and "Traceback" not in out  # no hub retries, no traceback for a user error
    assert out.count("asking ") == (0 if "HF_HUB_OFFLINE" in env else 1)  # one request in the whole sweep
    report = out[out.index("sweep: 2 of 2 jobs failed"):]
    assert "#0 method=ar" in report and "#1 method=vanilla" in report and "the same error as #0" in report
    assert f"  hf download {MISSING}\n" in report and "Pair 'qwen25coder_1p5b_0p5b' needs on GPUs" in report
    for job in ("0", "1"):
        log = (tmp_path / job / "run.log").read_text()
        assert f"{MISSING} (revision main) is not in the local Hugging Face cache" in log and "Traceback" in log


def test_a_single_failed_run_prints_the_message_and_hydra_full_error_the_traceback(tmp_path):
    args = ("pair=smollm2_135m", "method=ar", f"pair.target.path={MISSING}")  # the pair has no draft: ar runs there
    p = run_py(tmp_path, *args, env={"HF_HUB_OFFLINE": "1"})
    assert p.returncode != 0 and f"hf download {MISSING}" in p.stderr and "Traceback" not in p.stderr
    assert "jobs failed" not in p.stdout + p.stderr  # a single run has no sweep summary
    p = run_py(tmp_path, *args, env={"HF_HUB_OFFLINE": "1", "HYDRA_FULL_ERROR": "1"})
    assert "Traceback" in p.stderr and "ModelUnavailable" in p.stderr


@pytest.mark.slow  # ~40 s: the sweep and each job start their own Python process
def test_a_submitit_sweep_reports_every_failed_job(tmp_path):
    p = run_py(tmp_path, "-m", "hydra/launcher=local", "method=ar,vanilla", "pair=smollm2_135m",
               f"pair.target.path={MISSING}", env={"HF_HUB_OFFLINE": "1"})
    out = p.stdout + p.stderr
    assert p.returncode != 0
    report = out[out.index("sweep: 2 of 2 jobs failed"):]
    assert "method=ar" in report and "method=vanilla" in report and f"hf download {MISSING}" in report
