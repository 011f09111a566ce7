"Copy-consistent tokens: a copied name or number has the same ids in the question, a tool call and an answer; every kind of the smoke run's trajectories copies at the token level."
import pytest

from coa_lib.distill import trace_to_coa
from coa_lib.stage_filter import build_sft_sets
from coa_lib.stage_tasks import student_tokenizer
from coa_lib.tokenizer import build_tokenizer, copied_spans, copyability, gpt2_pre_tokenizer
from coa_lib.core import TASK_KINDS


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    rd = tmp_path_factory.mktemp("run")
    return rd, build_sft_sets(rd, "smoke", progress=False), student_tokenizer(rd, "smoke")


def span_ids(tok, text: str, span: str, start: int = 0) -> list[int]:
    "Ids of the tokens covering the first occurrence of `span` in `text` at or after `start`; they must start and end on it."
    a = text.index(span, start); b = a + len(span)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    cover = [(i, o) for i, o in zip(enc["input_ids"], enc["offset_mapping"]) if o[0] < b and o[1] > a]
    assert cover[0][1][0] == a and cover[-1][1][1] == b, f"{span!r} does not start and end on token boundaries in {text!r}"
    return [i for i, _ in cover]


def test_name_and_number_identical_in_question_and_tool_call(smoke_run):
    _, _, tok = smoke_run
    name, number = " Zosti Roglabros", "235193"
    text = (f"Question: In which city was{name} born, and what is {number} // 33?\n"
            f"<web_search>{name}</web_search>\n<code> print({number} // 33)</code>\n<answer> ({number})</answer>")
    q = text.index("Question")
    assert span_ids(tok, text, name, q) == span_ids(tok, text, name, text.index("<web_search>"))
    assert span_ids(tok, text, number, q) == span_ids(tok, text, number, text.index("<code>")) \
        == span_ids(tok, text, number, text.index("<answer>"))
    pieces = tok.convert_ids_to_tokens(span_ids(tok, text, number))
    assert "".join(pieces) == number and all(len(p) <= 3 for p in pieces)        # groups of at most 3 digits, no space


def test_copyability_of_every_kind_at_smoke(smoke_run):
    _, sets, tok = smoke_run
    rows = sets["coa_sft"]
    share = copyability(tok, rows)
    assert set(TASK_KINDS) <= set(share), share
    for kind in TASK_KINDS: assert share[kind] >= 0.99, (kind, share)


def test_copyability_can_fail():
    "A name copied without the space before it, or a number under GPT-2's pieces, is other ids than its source."
    text = "Kravomu Tiles was founded by Ana Vell in 1961 and employs 235193 people. " * 3 + "Who founded Kravomu Tiles?"
    row = {"kind": "multihop", "prompt": "Question: Who founded Kravomu Tiles? It employs 235193 people.\n",
           "completion": "<web_search> Kravomu Tiles</web_search>\n<observation>\nKravomu Tiles was founded by Ana Vell.\n</observation>\n"
                         "<code> print(235193 + 1)</code>\n<observation>\n235194\n</observation>\n<answer> Ana Vell</answer>"}
    assert len(copied_spans(row["prompt"], row["completion"])) == 3
    chosen = build_tokenizer([text] * 20, vocab_size=350)
    assert copyability(chosen, [row])["multihop"] == 1.0
    glued = {**row, "completion": row["completion"].replace("<web_search> ", "<web_search>")}
    assert copyability(chosen, [glued])["multihop"] < 1.0
    gpt2 = build_tokenizer([text] * 20 + ["(235193) 235193"] * 20, vocab_size=350, pre_tokenizer=gpt2_pre_tokenizer())
    assert copyability(gpt2, [row])["multihop"] < 1.0


def test_saved_student_keeps_the_copy_safe_tokens(smoke_run, tmp_path):
    "A student saved by `train_sft` and loaded back by path (training from a base dir, rollouts) tokenizes like the run's tokenizer."
    from coa_lib.llm import build_tiny_qwen2, load_policy
    from coa_lib.tokenizer import load_tokenizer
    from coa_lib.sft import SFTStageConfig, train_sft
    rd, sets, tok = smoke_run
    out = train_sft(sets["coa_sft"].select(range(4)), build_tiny_qwen2(tok, "nano"), tmp_path / "student",
                    SFTStageConfig.for_profile("smoke"), tokenizer=tok)
    text = "Question: Who founded Kravomu Tiles (235193)?\n<web_search> Kravomu Tiles</web_search>\n<answer>(235193)</answer>"
    want = tok(text, add_special_tokens=False)["input_ids"]
    assert load_tokenizer(out)(text, add_special_tokens=False)["input_ids"] == want
    assert load_policy(str(out)).tokenizer(text, add_special_tokens=False)["input_ids"] == want
