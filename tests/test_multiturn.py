"""Multi-turn examples: turn k is asked after the model's own answers to the earlier turns."""

from omegaconf import OmegaConf

from helpers import small
from specbench.data.dataset import Evaluator, Example
from specbench.runs.runner import Job, build_method, decode_batch, make_engine, sampling_params


class TwoTurns(Evaluator):
    name = "two_turns"

    def examples(self):
        return [Example(id="q1", prompt="Name a colour.", turns=["Name a colour.", "Now name another one."])]


def test_second_turn_sees_the_first_answer(tiny_pair):
    c = OmegaConf.to_container(small("method=vanilla", "decode.max_new_tokens=12"), resolve=False)
    method = build_method(c["method"])
    engine = make_engine(tiny_pair, method, sampling_params(c["decode"]), ())
    job = Job(engine, method, tiny_pair, TwoTurns(), c["dataset"], 12, 0, "error", False)
    ex = TwoTurns().examples()[0]
    [(g, info)] = decode_batch(job, [ex], False)
    a1, a2 = info["turn_outputs"]
    assert g.text == a2 and len(g.token_ids) == 24
    assert g.stop_reasons == ["length", "length"]  # each turn's, so a cut first answer is flagged too
    assert TwoTurns().truncated(ex, g.text, g.stop_reasons)
    # independent check: plain-format prompt "turn1\n\nanswer1\n\nturn2", decoded by the target alone
    ids = tiny_pair.tokenizer("\n\n".join([ex.turns[0], a1, ex.turns[1]]))["input_ids"]
    ar = make_engine(tiny_pair, build_method({"name": "ar"}), sampling_params(c["decode"]), ())
    assert ar.generate(ids, 12).text == a2
    assert info["prompt_tokens"] == len(tiny_pair.tokenizer(ex.turns[0])["input_ids"]) + len(ids)
