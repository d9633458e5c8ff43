"""lm-eval model `specbench`: lm-eval's tasks, prompts and metrics on any configured method and pair.

    python -m specbench.lm_eval --model specbench \\
        --model_args pair=tiny_random,method=vanilla,method.gamma=3,device=cpu --tasks gsm8k --limit 10

lm-eval 0.4.13 finds models only in its own registry (its CLI reads no entry points), so `python -m specbench.lm_eval`
imports this module (which registers `specbench`), then runs lm-eval's own CLI with the same arguments; from
Python, `import specbench.lm_eval` and call `lm_eval.simple_evaluate(model="specbench", ...)`.

model_args are Hydra overrides of conf/config.yaml, composed and checked as run.py does (`pair=...`,
`method.gamma=8`, `decode=t1`, `threads=1`, ...; values with commas need the JSON form of --model_args), plus
the adapter keys `config_dir` (default: the project's conf/), `rows_path` (a JSON-lines file receiving one row of
engine metrics per request) and `max_gen_toks` (the new-token cap of a request whose task sets none; default 256,
lm-eval's HFLM default). The device is lm-eval's `--device` (model_args cannot carry `device`: lm-eval always
passes its own, default "cuda:0", which falls back to the config's `device` when CUDA is not available).

Only `generate_until` requests are served (loglikelihood ones involve no decoding). As lm-eval's HF model does,
the context is left-truncated to fit, the task's `until` strings end the text, its `max_gen_toks` (or an alias
lm-eval accepts) caps new tokens (decode.max_new_tokens is refused), and its do_sample / temperature / top_k /
top_p override the decode config. Each request is seeded from decode.seed and its context, so a rerun gives the
same outputs.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, cast

import torch
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import normalize_gen_kwargs
from tqdm.auto import tqdm

from specbench.common.configs import compose_config, plain
from specbench.common.files import CONF_DIR
from specbench.common.options import OptionError, check_run_settings, integer
from specbench.decoding.metrics import example_metrics, summarize
from specbench.models.pairs import load_pair, resolve_device
from specbench.runs.overrides import check_option_overrides
from specbench.runs.binding import build_method, decoder_device, make_engine
from specbench.runs.job import example_seed, fit_prompt
from specbench.runs.validation import sampling_params, set_threads
from specbench.decoding.sampling import SamplingParams

log = logging.getLogger(__name__)

LM_EVAL_DEFAULT_DEVICE = "cuda:0"  # lm-eval's EvaluatorConfig default, passed whether or not --device was given
MAX_GEN_TOKS = 256  # lm-eval's HFLM.max_gen_toks: the cap of a request whose task sets none


def to_override(key: str, value: Any) -> str:
    """A model_args item (already typed by lm-eval's parser) as a Hydra override string."""
    if value is None or isinstance(value, (bool, list, dict)):
        value = json.dumps(value)  # true, false, null, JSON lists and dicts
    return f"{key}={value}"


def task_sampling(gen_kwargs: dict[str, Any], default: SamplingParams) -> SamplingParams:
    """The decode config's sampling settings, overridden by the task's generation kwargs."""
    temperature = float(gen_kwargs.get("temperature", default.temperature) or 0.0)
    if gen_kwargs.get("do_sample") is False:
        temperature = 0.0
    elif gen_kwargs.get("do_sample") is True and temperature == 0.0:
        temperature = 1.0
    return SamplingParams(temperature, gen_kwargs.get("top_k", default.top_k), gen_kwargs.get("top_p", default.top_p))


@register_model("specbench")
class SpecbenchLM(LM):
    """An lm-eval LM whose generate_until runs a specbench method on a specbench pair."""

    def __init__(self, config_dir: str | None = None, rows_path: str | None = None, batch_size: Any = None,
                 max_batch_size: Any = None, device: str | None = None, max_gen_toks: int = MAX_GEN_TOKS,
                 **overrides: Any) -> None:
        super().__init__()
        if "decode.max_new_tokens" in overrides:
            raise OptionError("decode.max_new_tokens does not apply under lm-eval: a request's cap is its task's "
                              "max_gen_toks, else the model_args key max_gen_toks (default 256, as lm-eval's HFLM)")
        self.max_gen_toks = integer(max_gen_toks, "max_gen_toks", low=1)
        args = [to_override(k, v) for k, v in overrides.items()]
        if device == LM_EVAL_DEFAULT_DEVICE and not torch.cuda.is_available():
            log.info("lm-eval's default device %s is not available; using the config's device", device)
        elif device is not None:
            args.append(to_override("device", device))
        if batch_size not in (None, 1, "1"):
            log.warning("specbench decodes one sequence at a time; batch_size=%s is ignored", batch_size)
        args = check_option_overrides(args, Path(config_dir or CONF_DIR))
        self.cfg = compose_config(args, config_dir or CONF_DIR)
        c = plain(self.cfg)
        check_run_settings(c)
        set_threads(c.get("threads", "auto"))  # CPU threads, as a run sets them
        self.params = sampling_params(c["decode"])
        self.seed = int(c["decode"]["seed"])
        self.method = build_method(c["method"])
        self.pair = load_pair(c["pair"], resolve_device(c.get("device", "auto")))
        self.extra_stops = tuple(c.get("stop_strings") or ())
        self.rows_path = Path(rows_path) if rows_path else None
        self.rows: list[dict[str, Any]] = []
        self._templated = False
        log.info("specbench lm-eval model: pair %s, method %s, overrides %s", c["pair"]["name"], self.method.name, args)

    @property
    def tokenizer_name(self) -> str:
        return str(self.pair.tokenizer.name_or_path).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.pair.tokenizer, "chat_template", None) or ""

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The chat formatted with the target tokenizer's template (lm-eval --apply_chat_template)."""
        if not getattr(self.pair.tokenizer, "chat_template", None):
            name = self.pair.tokenizer.name_or_path
            raise ValueError(f"--apply_chat_template: tokenizer {name!r} has no chat template")
        self._templated = True
        text = self.pair.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                       add_generation_prompt=add_generation_prompt)
        return cast(str, text)  # tokenize=False: the formatted text (transformers types every kind it may return)

    def generate_one(self, context: str, gen_kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Decode one request; returns the text (cut before any `until` string) and the engine metrics."""
        kwargs = dict(gen_kwargs)
        until = kwargs.pop("until", None) or ()
        until = (until,) if isinstance(until, str) else tuple(until)
        max_new = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)["max_gen_toks"]  # aliases, HFLM's default
        # the method bound to this request's sampling settings and stop strings (requests may differ)
        engine = make_engine(self.pair, self.method, task_sampling(kwargs, self.params), until + self.extra_stops)
        ids = self.pair.tokenizer(context, add_special_tokens=not self._templated)["input_ids"]
        ids, cut = fit_prompt(ids, engine.context_length, max_new, "truncate", "lm-eval request")
        gen = torch.Generator(device=decoder_device(engine)).manual_seed(example_seed(self.seed, context))
        g = engine.generate(ids, max_new, generator=gen)
        text = g.text
        for s in until:  # the engine already stops at them; cut again in case the text ended otherwise
            text = text.split(s)[0] if s else text
        return text, {"prompt_tokens": len(ids), "prompt_truncated_from": cut, **example_metrics(g)}

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        out = []
        for req in tqdm(requests, desc=f"specbench {self.method.name}", disable=disable_tqdm):
            context, gen_kwargs = req.args
            text, metrics = self.generate_one(context, gen_kwargs)
            row = {"task": req.task_name, "doc_id": req.doc_id, "method": self.method.name, "output": text, **metrics}
            self.rows.append(row)
            if self.rows_path:
                with self.rows_path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            self.cache_hook.add_partial("generate_until", req.args, text)
            out.append(text)
        s = summarize(self.rows)
        log.info("specbench %s: %d requests, %.1f tok/s, acceptance %s, block efficiency %s", self.method.name,
                 s["n_examples"], s["tokens_per_s"] or 0, s["acceptance_rate"], s["block_efficiency"])
        return out

    def loglikelihood(self, requests: list[Instance]) -> list[tuple[float, bool]]:
        raise NotImplementedError("the specbench model runs speculative decoding: it serves generate_until tasks "
                                  "(e.g. gsm8k, humaneval, mmlu_generative), not loglikelihood ones")

    def loglikelihood_rolling(self, requests: list[Instance]) -> list[float]:
        raise NotImplementedError("the specbench model serves generate_until tasks only (no loglikelihood_rolling)")


def main() -> None:
    """lm-eval's command line, with the `specbench` model registered in this process."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv[0] = "lm_eval"
    cli_evaluate()


if __name__ == "__main__":
    main()
