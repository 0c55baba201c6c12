"""hspack.capture.hf against real transformers on CPU.

A tiny random DeepSeek-V3 (61 layers, hidden 64, small MoE) sits inside a
multimodal-style wrapper that holds it as ``language_model``. Observed:

* Batched, left or right padded: every captured row is bitwise equal to the same
  batch's forward (``model(ids, attention_mask=..., output_hidden_states=True)``), row by
  row. Batched CPU kernels may round differently from single-sample ones (f32 by ~1e-7;
  bf16 by an ulp since torch 2.15, enough to move a MoE routing decision), so in f32 rows
  are also close to the sample run alone.
* ``batch_size=1``: every row is bitwise equal to the sample run alone, bf16 and f32.
"""

import json
import os

import pytest
import torch
from torch import nn

from hspack.capture import MemorySink, RowMismatch, UnsupportedSetup
from hspack.capture.hf import HFCapture, capture_samples, extract
from hspack.capture.prompts import Sample, tokenize_chat

LAYERS = [2, 30, 58, 60]
NUM_LAYERS = 61


def tiny_config():
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=NUM_LAYERS, num_attention_heads=4, num_key_value_heads=4,
        n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
        first_k_dense_replace=3, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, max_position_embeddings=256,
    )


class VisionLanguageWrapper(nn.Module):
    """Stands in for a ``...ForConditionalGeneration`` holding ``language_model``."""

    def __init__(self, lm):
        super().__init__()
        self.config = lm.config
        self.vision_tower = nn.Sequential(nn.Linear(8, 8))
        self.language_model = lm


def causal_lm_for_tests():
    """A 61-layer DeepSeek-V3 of random weights, tiny dimensions."""
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(0)
    return DeepseekV3ForCausalLM(tiny_config()).eval()


@pytest.fixture(scope="module")
def causal_lm():
    return causal_lm_for_tests()


def make_samples(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n, length in enumerate(lengths):
        ids = torch.randint(0, 128, (length,), generator=g).tolist()
        mask = [int(i % 3 != 0) for i in range(length)]
        out.append(Sample(key=f"s{n}", input_ids=ids, loss_mask=mask))
    return out


def alone(lm, ids):
    with torch.inference_mode():
        return lm(torch.tensor([ids]), output_hidden_states=True).hidden_states


def batched_reference(lm, samples, padding_side):
    """The hidden states of `samples` run as one padded batch, and each sample's rows."""
    width = max(len(s.input_ids) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, s in enumerate(samples):
        n = len(s.input_ids)
        sl = slice(width - n, width) if padding_side == "left" else slice(0, n)
        ids[b, sl] = torch.tensor(s.input_ids)
        mask[b, sl] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        ref = lm(ids, attention_mask=mask, position_ids=pos, output_hidden_states=True).hidden_states
    return ref, [mask[b].nonzero().flatten() for b in range(len(samples))]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_rows_equal_the_batched_reference_row_by_row(causal_lm, padding_side, dtype):
    lm = causal_lm.to(dtype)
    samples = make_samples([5, 11, 8] if dtype == torch.bfloat16 else [6, 9, 4], seed=2)
    sink = MemorySink()
    n = capture_samples(VisionLanguageWrapper(lm), samples, LAYERS, sink,
                        batch_size=3, padding_side=padding_side)
    assert n == 3 and sorted(sink) == ["s0", "s1", "s2"]
    ref, rows = batched_reference(lm, samples, padding_side)
    assert len(ref) == NUM_LAYERS + 1
    for b, s in enumerate(samples):
        got = sink[s.key]
        assert got["input_ids"].tolist() == s.input_ids and got["input_ids"].dtype == torch.int32
        assert got["loss_mask"].tolist() == s.loss_mask
        assert set(got) == {"input_ids", "loss_mask", *(f"hidden.{i}" for i in LAYERS + [NUM_LAYERS])}
        single = alone(lm, s.input_ids)
        for i in LAYERS + [NUM_LAYERS]:
            assert got[f"hidden.{i}"].dtype == dtype
            assert torch.equal(got[f"hidden.{i}"], ref[i][b, rows[b]]), (s.key, i)
            if dtype == torch.float32:
                torch.testing.assert_close(got[f"hidden.{i}"], single[i][0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_batch_of_one_is_bitwise_each_sample_alone(causal_lm, dtype):
    """With ``batch_size=1``, the per-sample mode, every row is bitwise the sample run
    alone, whatever the kernels do with batches (the test above)."""
    lm = causal_lm.to(dtype)
    samples = make_samples([5, 11, 8, 3])
    single = MemorySink()
    capture_samples(VisionLanguageWrapper(lm), samples, LAYERS, single, batch_size=1)
    assert sorted(single) == ["s0", "s1", "s2", "s3"]
    for s in samples:
        ref = alone(lm, s.input_ids)
        for i in LAYERS + [NUM_LAYERS]:
            assert single[s.key][f"hidden.{i}"].dtype == dtype
            assert torch.equal(single[s.key][f"hidden.{i}"], ref[i][0]), (s.key, i)


def test_single_sample_f32_is_exact(causal_lm):
    lm = causal_lm.to(torch.float32)
    ids = make_samples([7], seed=3)[0].input_ids
    with HFCapture(VisionLanguageWrapper(lm), [0, 60]) as cap:
        rows = cap.run(torch.tensor([ids]), torch.ones(1, 7, dtype=torch.long))
    ref = alone(lm, ids)
    assert sorted(rows[0]) == [0, 60, 61]
    assert torch.equal(rows[0][0], ref[0][0])  # id 0: embedding output
    assert torch.equal(rows[0][60], ref[60][0])
    assert torch.equal(rows[0][61], ref[61][0])


def test_resume_skips_stored_keys_and_schema_is_enforced(causal_lm):
    lm = causal_lm.to(torch.bfloat16)
    wrapper = VisionLanguageWrapper(lm)
    cap = HFCapture(wrapper, LAYERS)
    assert cap.decoder.path == "language_model.model"
    schema = cap.points.schema(64, torch.bfloat16)
    roles = {f["name"]: f["role"] for f in schema}
    assert roles["hidden.2"] == {"kind": "hidden_state", "layer": 2, "point": "layer_input"}
    assert roles["hidden.61"] == {"kind": "hidden_state", "layer": 61, "point": "final_norm"}
    sink = MemorySink(schema)
    samples = make_samples([4, 6, 5], seed=4)
    assert capture_samples(wrapper, samples[:1], LAYERS, sink) == 1
    first = sink["s0"]["hidden.30"].clone()
    assert capture_samples(wrapper, samples, LAYERS, sink, batch_size=2) == 2
    assert sorted(sink) == ["s0", "s1", "s2"]
    assert torch.equal(sink["s0"]["hidden.30"], first)


def test_refusals(causal_lm):
    wrapper = VisionLanguageWrapper(causal_lm.to(torch.bfloat16))
    with pytest.raises(ValueError, match="outside 0..61"):
        HFCapture(wrapper, [62])
    with HFCapture(wrapper, [2]) as cap:
        with pytest.raises(RowMismatch, match="contiguous"):
            cap.run(torch.ones(1, 4, dtype=torch.long), torch.tensor([[1, 0, 1, 1]]))
        # Rows that do not fit the sample are named with its key.
        with pytest.raises(RowMismatch, match=r"sample `req-7`: layer id 2: captured shape \(3, 64\)"):
            cap.points.sample(torch.arange(4), torch.ones(4), {2: torch.zeros(3, 64), 61: torch.zeros(4, 64)}, key="req-7")
    with pytest.raises(UnsupportedSetup, match="no decoder"):
        HFCapture(nn.Sequential(nn.Linear(2, 2)), [0])
    with pytest.raises(ValueError, match="unique"):
        capture_samples(wrapper, make_samples([3, 3])[:1] * 2, [2], MemorySink())


def chat_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<s>", "<pad>", "[U]", "[A]", "[S]", "[E]", "hi", "there", "how", "are", "you", "fine", "ok", "sys"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")
    fast.chat_template = (
        "{% for m in messages %}{% if m.role == 'user' %}[U] {% elif m.role == 'system' %}[S] "
        "{% else %}[A] {% endif %}{{ m.content }} [E] {% endfor %}"
        "{% if add_generation_prompt %}[A] {% endif %}"
    )
    return fast


def test_chat_loss_mask_covers_assistant_turns_only():
    tok = chat_tokenizer()
    turns = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "fine ok"},
        {"role": "user", "content": "how are you"},
        {"role": "assistant", "content": "ok"},
    ]
    ids, mask = tokenize_chat(tok, turns)
    words = tok.convert_ids_to_tokens(ids)
    assert words == ["[S]", "sys", "[E]", "[U]", "hi", "there", "[E]", "[A]", "fine", "ok", "[E]",
                     "[U]", "how", "are", "you", "[E]", "[A]", "ok", "[E]"]
    assert [w for w, m in zip(words, mask) if m] == ["fine", "ok", "[E]", "ok", "[E]"]


def test_extract_driver_resumes_with_a_sink(tmp_path, causal_lm):
    lm = causal_lm.to(torch.bfloat16)
    lm.save_pretrained(tmp_path / "model")
    chat_tokenizer().save_pretrained(tmp_path / "model")
    data = tmp_path / "prompts.jsonl"
    lines = [
        {"id": "a", "input_ids": [5, 6, 7, 8], "loss_mask": [0, 0, 1, 1]},
        {"id": "b", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "fine"}]},
        {"id": 3, "conversations": [{"from": "human", "value": "how are you"}, {"from": "gpt", "value": "ok ok"}]},
    ]
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    sink = MemorySink()
    n = extract(str(tmp_path / "model"), str(data), LAYERS, str(tmp_path / "out"), batch_size=2, sink=sink)
    assert n == 3 and sorted(sink) == ["3", "a", "b"]
    assert sink["b"]["loss_mask"].tolist() == [0, 0, 0, 0, 1, 1]  # [U] hi [E] [A] fine [E]
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.bfloat16).eval()
    ref = alone(loaded, sink["3"]["input_ids"].tolist())
    assert torch.equal(sink["3"]["hidden.58"], ref[58][0])
    assert extract(str(tmp_path / "model"), str(data), LAYERS, str(tmp_path / "out"), sink=sink) == 0


def test_an_interrupted_extract_commits_what_it_captured_and_a_rerun_captures_the_rest(tmp_path, causal_lm, monkeypatch, capsys):
    """Ctrl-C during an extraction dropped every sample captured since the last commit (all
    of them, for a shard not yet full); they are whole, so they are committed, and said."""
    import hspack
    from hspack.capture import hf

    causal_lm.to(torch.bfloat16).save_pretrained(tmp_path / "model")
    chat_tokenizer().save_pretrained(tmp_path / "model")
    model, data, out = str(tmp_path / "model"), tmp_path / "prompts.jsonl", str(tmp_path / "ds")
    data.write_text("".join(json.dumps({"id": f"p{i}", "input_ids": [5 + i, 6, 7, 8]}) + "\n" for i in range(5)))
    run, calls = HFCapture.run, []

    def interrupted_at_the_fourth_batch(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return run(self, *args, **kwargs)

    monkeypatch.setattr(HFCapture, "run", interrupted_at_the_fourth_batch)
    with pytest.raises(KeyboardInterrupt) as e:
        extract(model, str(data), LAYERS, out, batch_size=1)
    assert f"{out} holds the 3 samples captured so far" in " ".join(e.value.__notes__)
    assert len(hspack.open(out)) == 3
    monkeypatch.undo()
    assert extract(model, str(data), LAYERS, out, batch_size=1) == 2
    assert sorted(hspack.open(out).keys()) == [f"p{i}" for i in range(5)]
    # Interrupted again while committing: the command says so, not that nothing was
    # committed (it said so, the commit having landed), and exits 130.
    calls.clear()
    monkeypatch.setattr(HFCapture, "run", interrupted_at_the_fourth_batch)
    commit = hspack.Writer.commit

    def interrupted_after(self):
        commit(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(hspack.Writer, "commit", interrupted_after)
    again = str(tmp_path / "again")
    code = hf.main(["extract", "--model", model, "--data", str(data), "--layers", ",".join(map(str, LAYERS)), "--out", again, "--batch-size", "1"])
    said = capsys.readouterr().err
    assert code == 130 and "interrupted again while committing what was captured" in said, said
    assert "nothing was committed" not in said


def test_resume_refuses_a_stored_sample_whose_prompt_now_gives_other_tokens(tmp_path, causal_lm):
    """A rerun into the same dataset resumes only samples stored from the tokens their
    prompts give now: another --max-len, an edited prompt or loss mask under the same id is
    refused naming the sample (exit 2 from the command), and the dataset keeps what it held."""
    import subprocess
    import sys

    import hspack

    causal_lm.to(torch.bfloat16).save_pretrained(tmp_path / "model")
    chat_tokenizer().save_pretrained(tmp_path / "model")
    model, data, out = str(tmp_path / "model"), tmp_path / "prompts.jsonl", str(tmp_path / "ds")
    a = {"id": "a", "input_ids": [5, 6, 7, 8, 9, 10], "loss_mask": [0, 0, 1, 1, 1, 1]}
    b = {"id": "b", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "fine"}]}

    def write(*lines):
        data.write_text("".join(json.dumps(x) + "\n" for x in lines))

    write(a, b)
    assert extract(model, str(data), LAYERS, out, batch_size=2) == 2
    assert extract(model, str(data), LAYERS, out, batch_size=2) == 0  # unchanged: resumed
    with pytest.raises(RowMismatch, match=r"holds sample `a` \(and 1 more: `b`\).*the stored token ids have "
                                          r"6 entries, the prompt's 4.*capture into a new dataset"):
        extract(model, str(data), LAYERS, out, max_len=4)
    edited = dict(b, messages=[b["messages"][0], {"role": "assistant", "content": "ok"}])
    write(a, edited)
    with pytest.raises(RowMismatch, match=r"sample `b`, .*token ids differ first at position 4"):
        extract(model, str(data), LAYERS, out)
    write(dict(a, loss_mask=[0, 1, 1, 1, 1, 1]), b)
    with pytest.raises(RowMismatch, match=r"sample `a`, .*loss mask differ first at position 1 \(stored 0, now 1\)"):
        extract(model, str(data), LAYERS, out)
    write(a, b)
    cmd = [sys.executable, "-m", "hspack.capture.hf", "extract", "--model", model, "--data", str(data),
           "--layers", ",".join(map(str, LAYERS)), "--out", out, "--max-len", "4"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    said = run.stderr.strip().splitlines()[-1]
    assert said.startswith("python -m hspack.capture.hf: error: ") and "sample `a`" in said, run.stderr
    ds = hspack.open(out)
    assert sorted(ds.keys()) == ["a", "b"] and ds.get("a")["input_ids"].tolist() == a["input_ids"]
    # A MemorySink is checked the same way.
    sink = MemorySink()
    samples = make_samples([4, 5], seed=3)
    capture_samples(causal_lm, samples, [2], sink)
    samples[1].input_ids[2] += 1
    with pytest.raises(RowMismatch, match=r"the sink already holds sample `s1`.*differ first at position 2"):
        capture_samples(causal_lm, samples, [2], sink)


def test_a_model_of_an_unsupported_family_is_a_plain_error(tmp_path):
    """A model whose decoder layers are not found (GPT-2 keeps them in `h`, its final norm in
    `ln_f`) is refused by the command as a plain error: exit 2, no traceback."""
    import subprocess
    import sys

    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)).save_pretrained(tmp_path / "gpt2")
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"id": "a", "input_ids": [5, 6, 7]}) + "\n")
    cmd = [sys.executable, "-m", "hspack.capture.hf", "extract", "--model", str(tmp_path / "gpt2"), "--data", str(data),
           "--layers", "1", "--out", str(tmp_path / "ds"), "--dtype", "f32"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    said = run.stderr.strip().splitlines()[-1]
    assert said.startswith("python -m hspack.capture.hf: error: no decoder found under GPT2LMHeadModel"), run.stderr


def test_extract_command_writes_a_dataset_that_reads_back_bitwise(tmp_path, causal_lm):
    import subprocess
    import sys

    import hspack

    lm = causal_lm.to(torch.bfloat16)
    lm.save_pretrained(tmp_path / "model")
    chat_tokenizer().save_pretrained(tmp_path / "model")
    data = tmp_path / "prompts.jsonl"
    lines = [
        {"id": "a", "input_ids": [5, 6, 7, 8], "loss_mask": [0, 0, 1, 1]},
        {"id": "b", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "fine"}]},
    ]
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "hspack.capture.hf", "extract", "--model", str(tmp_path / "model"),
           "--data", str(data), "--layers", ",".join(map(str, LAYERS)), "--out", str(out), "--batch-size", "2"]
    subprocess.run(cmd, check=True, capture_output=True)
    ds = hspack.open(str(out))
    assert sorted(ds.keys()) == ["a", "b"]
    assert ds.capture["tool"] == "hspack.capture.hf" and ds.capture["num_layers"] == 61
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.bfloat16).eval()
    got = ds.get("a")
    ref = alone(loaded, [5, 6, 7, 8])
    for layer in LAYERS:
        assert torch.equal(got[f"hidden.{layer}"], ref[layer][0]), layer
    assert got["loss_mask"].tolist() == [0, 0, 1, 1]
    # A rerun resumes: nothing new is written, the dataset still verifies.
    subprocess.run(cmd, check=True, capture_output=True)
    assert len(hspack.open(str(out))) == 2
    assert hspack.verify(str(out))["ok"]


def test_extract_without_a_tokenizer_and_its_refusals_without_a_traceback(tmp_path, causal_lm):
    """A model saved without a tokenizer captures prompts given as token ids; prompts that
    need one, layers the model lacks and a missing prompt file are plain errors (exit 2, no
    traceback), each found before the model is loaded."""
    import subprocess
    import sys

    import hspack

    lm = causal_lm.to(torch.bfloat16)
    lm.save_pretrained(tmp_path / "model")
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"id": "a", "input_ids": [5, 6, 7, 8]}) + "\n")

    def extract(*extra, data=data, layers=LAYERS, model=tmp_path / "model"):
        cmd = [sys.executable, "-m", "hspack.capture.hf", "extract", "--model", str(model),
               "--data", str(data), "--layers", ",".join(map(str, layers)), "--out", str(tmp_path / "ds"), *extra]
        return subprocess.run(cmd, capture_output=True, text=True)

    run = extract()
    assert run.returncode == 0, run.stderr
    assert hspack.open(str(tmp_path / "ds")).keys() == ["a"]
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"id": "b", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    foreign = tmp_path / "foreign.jsonl"
    vocab = lm.config.vocab_size
    foreign.write_text(json.dumps({"id": "f", "input_ids": [1, 2, vocab]}) + "\n")
    for run, said in [
        (extract(data=chat), "its tokenizer does not load"),
        (extract(data=foreign), f"prompt `f` has token id {vocab} at position 2, outside the model's vocabulary"),
        (extract(layers=[2, 99]), "outside"),
        (extract(data=tmp_path / "nosuch.jsonl"), "nosuch.jsonl"),
        # A mistyped model folder was taken for a hub id ("Repo id must be in the form ...").
        (extract(model=tmp_path / "modle"), f"model {tmp_path / 'modle'}: no such folder"),
        (extract(model=data), "is a file; give the folder of a saved model"),
    ]:
        assert run.returncode == 2, run.stderr
        assert "Traceback" not in run.stderr and said in run.stderr, run.stderr
        assert run.stderr.startswith("python -m hspack.capture.hf: error: "), run.stderr


def test_extract_ranks_capture_their_parts_into_one_shared_dataset(tmp_path, causal_lm):
    import subprocess
    import sys

    import hspack

    lm = causal_lm.to(torch.bfloat16)
    lm.save_pretrained(tmp_path / "model")
    chat_tokenizer().save_pretrained(tmp_path / "model")
    data = tmp_path / "prompts.jsonl"
    prompts = {f"p{i}": [5 + i % 7, 6, 7 + i % 3, 8, 9][: 2 + i % 4] for i in range(9)}
    data.write_text("".join(json.dumps({"id": k, "input_ids": v}) + "\n" for k, v in prompts.items()))
    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "hspack.capture.hf", "extract", "--model", str(tmp_path / "model"),
           "--data", str(data), "--layers", ",".join(map(str, LAYERS)), "--out", str(out), "--batch-size", "2"]
    # Three ranks at once, as torchrun starts them (RANK and WORLD_SIZE in the environment).
    ranks = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": "3"})
             for r in range(3)]
    for p in ranks:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
        assert "wrote 3 samples" in err.decode(), err.decode()
    ds = hspack.open(str(out))
    assert sorted(ds.keys()) == sorted(prompts) and len(ds) == 9
    assert hspack.verify(str(out))["ok"]
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.bfloat16).eval()
    for key, ids in prompts.items():
        got, ref = ds.get(key), alone(loaded, ids)
        for layer in LAYERS:
            assert torch.equal(got[f"hidden.{layer}"], ref[layer][0]), (key, layer)
    # Rank 1 run again resumes: its samples are there, nothing is written twice.
    again = subprocess.run(cmd + ["--rank", "1", "--world-size", "3"], capture_output=True, check=True)
    assert "wrote 0 samples" in again.stderr.decode()
    assert len(hspack.open(str(out))) == 9
    with pytest.raises(ValueError, match="rank 3"):
        extract(str(tmp_path / "model"), str(data), LAYERS, str(tmp_path / "x"), rank=3, world_size=3)


def test_stack_needs_an_auxiliary_layer_and_a_target():
    from hspack.capture.points import CapturePoints

    with pytest.raises(ValueError, match="stacking needs at least two"):
        CapturePoints.select(NUM_LAYERS, [], final_norm=True, stack=True)
    p = CapturePoints.select(NUM_LAYERS, [2, 30, 58], stack=True)
    assert p.stacked_ids == (2, 30, 58) and p.fields == ("aux_hidden_state", f"hidden.{NUM_LAYERS}")


def test_extract_with_stack_writes_the_eagle3_layout_read_without_a_copy(tmp_path, causal_lm):
    """`--stack`: the auxiliary layers in one stacked field, bitwise the states of the sample
    run alone, which the EAGLE-3 view hands out as a view of the mapped shard."""
    import subprocess
    import sys

    import hspack
    from hspack.torch import HspackDataset

    lm = causal_lm.to(torch.bfloat16)
    lm.save_pretrained(tmp_path / "model")
    chat_tokenizer().save_pretrained(tmp_path / "model")
    data = tmp_path / "prompts.jsonl"
    prompts = {"a": [5, 6, 7, 8], "b": [9, 3, 4, 1, 2, 7, 7]}
    data.write_text("".join(json.dumps({"id": k, "input_ids": v, "loss_mask": [1] * len(v)}) + "\n" for k, v in prompts.items()))
    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "hspack.capture.hf", "extract", "--model", str(tmp_path / "model"),
           "--data", str(data), "--layers", "2,30,58", "--out", str(out), "--stack"]
    subprocess.run(cmd, check=True, capture_output=True)
    ds = hspack.open(str(out))
    fields = {f["name"]: f for f in ds.schema}
    assert list(fields) == ["input_ids", "loss_mask", "aux_hidden_state", f"hidden.{NUM_LAYERS}"]
    assert fields["aux_hidden_state"]["shape"] == [3, 64]
    assert fields["aux_hidden_state"]["role"] == {"kind": "hidden_states", "layers": [2, 30, 58], "point": "layer_input"}
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.bfloat16).eval()
    view = HspackDataset(str(out), view="eagle3")
    for key, ids in prompts.items():
        ref = alone(loaded, ids)
        got = ds.get(key)
        assert torch.equal(got["aux_hidden_state"], torch.stack([ref[i][0] for i in (2, 30, 58)], 1)), key
        assert torch.equal(got[f"hidden.{NUM_LAYERS}"], ref[-1][0]), key
        ordinal = ds.ordinal(key)
        item = view[ordinal]
        assert torch.equal(item["aux_hidden_state"], torch.cat([ref[i][0] for i in (2, 30, 58)], -1))
        assert torch.equal(item["hidden_state"], ref[-1][0])
        base, size = view.hspack.native.mapping_range(0)
        assert base <= item["aux_hidden_state"].data_ptr() < base + size, "the stacked field was copied"


def test_extract_command_quantize_stores_fp8_near_the_exact_capture(tmp_path, causal_lm):
    """`extract --quantize fp8`: the hidden states stored as FP8 (a scale per token and
    layer), the token ids and loss mask exact; what reads back is within FP8's error of the
    exact capture of the same prompts, and `hspack info`'s schema says it."""
    import subprocess
    import sys

    import hspack

    lm = causal_lm.to(torch.bfloat16)
    lm.save_pretrained(tmp_path / "model")
    chat_tokenizer().save_pretrained(tmp_path / "model")
    data = tmp_path / "prompts.jsonl"
    lines = [{"id": f"p{i}", "input_ids": list(range(5 + i, 40 + 3 * i))} for i in range(4)]
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    base = [sys.executable, "-m", "hspack.capture.hf", "extract", "--model", str(tmp_path / "model"),
            "--data", str(data), "--layers", ",".join(map(str, LAYERS)), "--batch-size", "1", "--stack"]
    subprocess.run(base + ["--out", str(tmp_path / "exact")], check=True, capture_output=True)
    subprocess.run(base + ["--out", str(tmp_path / "fp8"), "--quantize", "fp8"], check=True, capture_output=True)
    q = hspack.open(str(tmp_path / "fp8"))
    quantized = {f["name"]: f.get("quantized") for f in q.schema}
    assert quantized["aux_hidden_state"] == {"scheme": "fp8-e4m3fn", "group": q.capture["hidden_size"]}
    assert quantized["input_ids"] is None and quantized["loss_mask"] is None
    c = hspack.compare(str(tmp_path / "exact"), str(tmp_path / "fp8"))
    for f in c["fields"]:
        if f["stored"] == "exact":
            assert f["differing"] == 0, f
        else:
            assert 0 < f["rel_l2"] < 0.06 and f["cosine_min"] > 0.99, f


def small_llama(**extra):
    """A 3-layer Llama of random weights (vocab 100), in training mode as built."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **extra)
    return LlamaForCausalLM(cfg)


def test_a_model_in_training_mode_is_captured_without_dropout_and_left_in_training_mode():
    """Capturing mid-training: the decoder runs in eval mode (no dropout), so the rows are
    the eval model's, and every module is back in its own mode afterwards (a module the
    user froze in eval stays in eval)."""
    lm = small_llama(attention_dropout=0.5)
    samples = make_samples([5, 3, 7], seed=5)
    samples = [Sample(s.key, [t % 100 for t in s.input_ids], s.loss_mask) for s in samples]
    want = MemorySink()
    capture_samples(lm.eval(), samples, [1, 3], want, batch_size=2)
    lm.train()
    lm.model.layers[1].mlp.eval()
    got = MemorySink()
    capture_samples(lm, samples, [1, 3], got, batch_size=2)
    for s in samples:
        for name in ("hidden.1", "hidden.3"):
            assert torch.equal(got[s.key][name], want[s.key][name]), (s.key, name)
    assert lm.training and lm.model.layers[0].self_attn.training and lm.model.training
    assert not lm.model.layers[1].mlp.training and not lm.model.layers[1].mlp.act_fn.training
    # HFCapture itself too, batch by batch.
    with HFCapture(lm, [2]) as cap:
        ids = torch.tensor([samples[0].input_ids])
        rows = cap.run(ids, torch.ones_like(ids))
        assert lm.training
    ref = alone(lm.eval(), samples[0].input_ids)
    assert torch.equal(rows[0][2], ref[2][0])


@pytest.mark.parametrize("pad_id", [-1, 100, 7])
def test_a_pad_id_outside_the_vocabulary_pads_with_a_valid_id(pad_id):
    """`pad_token_id=-1` (or one past the vocabulary), as configs and tokenizers may say:
    padded positions are masked, so padding with a valid id gives the same rows as pad 0."""
    lm = small_llama().eval()
    samples = [Sample("a", [1, 2, 3, 4], [1] * 4), Sample("b", [5, 6], [1] * 2)]
    for side in ("right", "left"):
        want, got = MemorySink(), MemorySink()
        capture_samples(lm, samples, [1, 3], want, pad_id=0, padding_side=side)
        capture_samples(lm, samples, [1, 3], got, pad_id=pad_id, padding_side=side)
        for s in samples:
            for name in ("hidden.1", "hidden.3"):
                assert torch.equal(got[s.key][name], want[s.key][name]), (side, s.key, name)


def test_resume_refuses_a_held_sample_not_yet_committed(tmp_path):
    """A key appended to an open writer but not committed cannot be read back to check its
    tokens: capturing it again through the same writer is refused naming it (not counted
    as resumed), and once committed the usual token check applies."""
    import hspack

    from hspack.capture import CapturePoints
    from hspack.capture.reuse import CaptureCounts

    lm = small_llama().eval()
    schema = CapturePoints.select(3, [1]).schema(32, torch.float32)
    with hspack.Writer(str(tmp_path / "ds"), schema) as w:
        assert capture_samples(lm, [Sample("a", [1, 2, 3, 4], [1] * 4)], [1], w) == 1
        counts = CaptureCounts()
        with pytest.raises(UnsupportedSetup, match=r"sample `a` was appended .* not committed.*commit the writer"):
            capture_samples(lm, [Sample("a", [9, 9], [1] * 2)], [1], w, counts=counts)
        w.commit()
        with pytest.raises(RowMismatch, match=r"holds sample `a`.*4 entries, the prompt's 2"):
            capture_samples(lm, [Sample("a", [9, 9], [1] * 2)], [1], w)
        assert capture_samples(lm, [Sample("a", [1, 2, 3, 4], [1] * 4)], [1], w) == 0
