"""Does a drafter trained on FP8-stored hidden states learn as well as one trained on bf16?

1. A tiny Llama (transformers, random init: hidden 256, 4 layers, vocabulary 512) is trained
   for `--lm-steps` steps on a synthetic language (a sparse random Markov chain), so that its
   hidden states have structure.
2. Its hidden states are captured for `--samples` sequences of 128 tokens (`output_hidden_states`,
   bf16): the inputs of layers 1, 2, 3 stacked (EAGLE-3's auxiliary states) and the state
   after the final norm (the target), and written twice with `hspack.Writer`: exactly and
   with `quantize="fp8"`.
3. Two EAGLE-3-style drafters, same initialization, same batches (`hspack.torch` EAGLE-3 view
   of each dataset), are trained for `--steps` steps: features = fc(aux at t) + embedding of
   token t+1, one residual MLP, predicting the target state at t+1 (smooth L1 loss).
4. Both are evaluated on held-out sequences read from the exact dataset: the regression loss,
   the cosine of predicted and true states, and how often the LM head's top-1 token of the
   predicted state equals that of the true state (a proxy for acceptance).

Repeated for `--seeds` drafter seeds (the captured data is the same); prints every figure
and the mean difference fp8 - bf16.

    python3 benches/python/fp8_drafter.py --seeds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
from torch import nn

import hspack
from hspack.torch import Eagle3View, HspackDataset

H, LAYERS, VOCAB, T = 256, 4, 512, 128
AUX = [1, 2, 3]


def language(gen, n, t):
    """Sequences of a sparse Markov chain: each token has 4 likely successors."""
    succ = torch.randint(0, VOCAB, (VOCAB, 4), generator=gen)
    seqs = torch.empty(n, t, dtype=torch.long)
    seqs[:, 0] = torch.randint(0, VOCAB, (n,), generator=gen)
    for i in range(1, t):
        pick = torch.randint(0, 4, (n,), generator=gen)
        noise = torch.rand(n, generator=gen) < 0.1
        nxt = succ[seqs[:, i - 1], pick]
        seqs[:, i] = torch.where(noise, torch.randint(0, VOCAB, (n,), generator=gen), nxt)
    return seqs, succ


def train_lm(gen, steps):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=T)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data, succ = language(gen, 4096, T)
    for step in range(steps):
        batch = data[torch.randint(0, len(data), (16,), generator=gen)]
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"LM trained {steps} steps, last loss {loss.item():.3f} (uniform would be {torch.log(torch.tensor(float(VOCAB))):.3f})")
    return model.eval().to(torch.bfloat16), succ


def capture(model, seqs, path, quantize):
    fields = [hspack.token_ids(), hspack.hidden_states(AUX, H), hspack.hidden_state(LAYERS, H, point="final_norm")]
    options = {"quantize": "fp8"} if quantize else {}
    with torch.no_grad(), hspack.Writer(path, fields, create=True, durable=False, **options) as w:
        for i in range(0, len(seqs), 32):
            out = model(input_ids=seqs[i : i + 32], output_hidden_states=True)
            hs = out.hidden_states  # [embeddings, layer 1 input, ..., after the final norm]
            for j in range(hs[0].shape[0]):
                w.append(
                    f"q{i + j}",
                    input_ids=seqs[i + j].to(torch.int32),
                    aux_hidden_state=torch.stack([hs[l][j] for l in AUX], 1).contiguous(),
                    **{f"hidden.{LAYERS}": hs[-1][j].contiguous()},
                )


class Drafter(nn.Module):
    def __init__(self, embed):
        super().__init__()
        self.fc = nn.Linear(len(AUX) * H, H)
        self.embed = nn.Embedding.from_pretrained(embed.clone(), freeze=True)
        self.mlp = nn.Sequential(nn.LayerNorm(H), nn.Linear(H, 4 * H), nn.GELU(), nn.Linear(4 * H, H))

    def forward(self, aux, next_ids):
        x = self.fc(aux) + self.embed(next_ids)
        return x + self.mlp(x)


def batches(path, n, seed, limit):
    """`n` batches of 8 of the first `limit` sequences from the EAGLE-3 view, the order fixed
    by `seed`."""
    ds = HspackDataset(path, view=Eagle3View())
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        items = [ds[int(i)] for i in torch.randint(0, limit, (8,), generator=g)]
        yield (
            torch.stack([it["aux_hidden_state"] for it in items]).float(),
            torch.stack([it["input_ids"] for it in items]).long(),
            torch.stack([it["hidden_state"] for it in items]).float(),
        )


def step_inputs(aux, ids, target):
    # Predict the state at t+1 from the features at t and the token at t+1.
    return aux[:, :-1], ids[:, 1:], target[:, 1:]


def train(path, embed, steps, seed, limit):
    torch.manual_seed(seed)
    d = Drafter(embed)
    opt = torch.optim.AdamW([p for p in d.parameters() if p.requires_grad], lr=1e-3)
    for aux, ids, target in batches(path, steps, seed, limit):
        a, n, y = step_inputs(aux, ids, target)
        loss = nn.functional.smooth_l1_loss(d(a, n), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return d


def evaluate(d, path, head, held_out):
    ds = HspackDataset(path, view=Eagle3View())
    losses, cos, agree, n = [], [], 0, 0
    with torch.no_grad():
        for i in held_out:
            it = ds[i]
            a, ids, y = step_inputs(it["aux_hidden_state"][None].float(), it["input_ids"][None].long(), it["hidden_state"][None].float())
            p = d(a, ids)
            losses.append(nn.functional.smooth_l1_loss(p, y).item())
            cos.append(nn.functional.cosine_similarity(p, y, dim=-1).mean().item())
            agree += (head(p).argmax(-1) == head(y).argmax(-1)).sum().item()
            n += y.shape[1]
    return statistics.mean(losses), statistics.mean(cos), agree / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lm-steps", type=int, default=300)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--held-out", type=int, default=128)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    started = time.time()
    gen = torch.Generator().manual_seed(1)
    model, _ = train_lm(gen, args.lm_steps)
    seqs, _ = language(torch.Generator().manual_seed(2), args.samples + args.held_out, T)
    root = tempfile.mkdtemp(prefix="fp8-drafter-")
    exact, fp8 = os.path.join(root, "bf16"), os.path.join(root, "fp8")
    capture(model, seqs, exact, False)
    capture(model, seqs, fp8, True)
    cmp = hspack.compare(exact, fp8)
    for f in cmp["fields"]:
        if f["stored"] != "exact":
            print(f"stored error {f['field']} layer {f['layer']}: rel L2 {f['rel_l2']:.4f}, cosine mean {f['cosine_mean']:.6f} min {f['cosine_min']:.6f}")
    size = lambda p: sum(s["bytes"] for s in hspack.open(p).shards)  # noqa: E731
    print(f"bytes: bf16 {size(exact)}, fp8 {size(fp8)} ({size(fp8) / size(exact):.3f})")
    embed = model.model.embed_tokens.weight.detach().float()
    head = lambda h: h @ model.lm_head.weight.detach().float().T  # noqa: E731
    held_out = list(range(args.samples, args.samples + args.held_out))
    rows = {"bf16": [], "fp8": []}
    for seed in range(args.seeds):
        for name, path in (("bf16", exact), ("fp8", fp8)):
            d = train(path, embed, args.steps, seed, args.samples)
            rows[name].append(evaluate(d, exact, head, held_out))
    print("load average", os.getloadavg(), "torch", torch.__version__, "hspack", hspack.__version__, f"{time.time() - started:.0f} s")
    print()
    print("| trained on | seed | eval smooth-L1 | eval cosine | top-1 agreement |")
    print("|---|---:|---:|---:|---:|")
    for name in ("bf16", "fp8"):
        for seed, (l, c, a) in enumerate(rows[name]):
            print(f"| {name} | {seed} | {l:.5f} | {c:.5f} | {a:.4f} |")
    diff = [f[0] / b[0] - 1 for b, f in zip(rows["bf16"], rows["fp8"])]
    agree = [f[2] - b[2] for b, f in zip(rows["bf16"], rows["fp8"])]
    print()
    print(f"fp8 / bf16 eval loss - 1, per seed: {', '.join(f'{d * 100:+.2f} %' for d in diff)}; mean {statistics.mean(diff) * 100:+.2f} %")
    print(f"top-1 agreement fp8 - bf16, per seed: {', '.join(f'{a * 100:+.2f} pt' for a in agree)}")


if __name__ == "__main__":
    main()
