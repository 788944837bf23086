"""What a demo model's answers depend on: teacher-forced exact match under chosen pause layouts.

For the CYB model of a ``cyb demo`` run, lays the held-out examples out as Recipe 2 training does
(:func:`cyb.layout.expand_variable`: same ids and positions) with a fixed number of pauses after
the prompt's tokens, after its last token ``=`` and after each answer token, runs one forward,
and reads every answer block out greedily over its valid steps (what generation would emit
while the prefix is right).  Then generates the answers freely in fixed and adaptive mode.
Prompt/``=``/answer pauses of ``M-1``/``M-1``/``M-1`` are fixed mode's layout; ``M-1``/``0``/``0``
is adaptive mode's for a model that never says dk::

    python experiments/adaptive_layout_probe.py runs/demo/runs/cyb [--examples 512]

Prints one line per layout (exact match, accuracy per answer position, mean and largest ``d_1``
on the answer blocks) and one per decoding mode (exact match, steps per generated token).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a demo run's method folder (REPORT/runs/cyb), with final/")
    p.add_argument("--examples", type=int, default=512, help="held-out examples to use (default 512)")
    args = p.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    import torch

    from cyb.config import RunConfig
    from cyb.run_data import task_split
    from cyb.decision import greedy_decision
    from cyb.generation import generate
    from cyb.layout import expand_variable
    from cyb.model import PauseModel

    settings = json.loads((args.run.parent.parent / "settings.json").read_text())
    cfg = RunConfig.from_dict(settings["runs"][args.run.name])
    test = task_split(cfg, split="test")
    model = PauseModel.from_pretrained(args.run / "final").eval()
    vocab, m, n = model.vocab, model.num_steps, args.examples
    if vocab.dk_id is None:
        raise SystemExit(f"{args.run}: a model with dk is needed (cyb and the recipes beyond it)")
    ids, mask = test.ids[:n], test.attention_mask[:n]
    start, lengths = test.answer_start[:n], test.lengths[:n]
    col = torch.arange(ids.shape[1])[None]
    eq_block = col == (start - 1)[:, None]  # the block of "=" predicts the first answer token
    answer_block = (col >= start[:, None]) & (col < (lengths - 1)[:, None])
    scored = eq_block | answer_block
    index = scored.long().cumsum(1) - 1  # answer position each scored block predicts
    target = torch.full_like(ids, -1)
    target[:, :-1] = ids[:, 1:]

    @torch.no_grad()
    def probe(prompt: int, eq: int, answer: int) -> str:
        counts = torch.full_like(ids, prompt)
        counts = torch.where(eq_block, eq, torch.where(answer_block, answer, counts)) * mask
        lay = expand_variable(ids, counts, vocab, attention_mask=mask, check_ids=False)
        hidden, _ = model.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask)
        z = lay.gather(model.logits(hidden)).float()
        z[..., list(vocab.pause_ids)] = float("-inf")
        token, _ = greedy_decision(z, dk_id=vocab.dk_id, dk_bias=model.dk_bias, num_valid_steps=counts + 1)
        hit = token == target
        exact = float((hit | ~scored).all(1).double().mean())
        per = [float(hit[scored & (index == k)].double().mean()) for k in range(int(index[scored].max()) + 1)]
        zd = z[..., 0, vocab.dk_id] + model.dk_bias
        rest = torch.logsumexp(z[..., 0, :].index_fill(-1, torch.tensor([vocab.dk_id]), float("-inf")), -1)
        d1 = torch.sigmoid(zd - rest)[scored]
        return (f"pauses after prompt/'='/answer tokens {prompt}/{eq}/{answer}: exact match {exact:.1%}, "
                f"per answer position {', '.join(f'{x:.3f}' for x in per)}; d_1 mean {float(d1.mean()):.4f}, "
                f"max {float(d1.max()):.3f}")

    full = m - 1
    for layout in [(full, full, full), (full, 0, 0), (full, full, 0), (full, 0, full), (full, 1, 1),
                   (0, 0, 0)]:
        print(probe(*layout), flush=True)
    longest = max(len(a) for a in test.answers[:n]) + 1
    for mode in ("fixed", "adaptive"):
        results = generate(model, test.prompts[:n], mode=mode, max_new_tokens=longest)
        right = sum(r.text.strip() == a for r, a in zip(results, test.answers[:n]))
        steps = [s for r in results for s in r.steps]
        print(f"free {mode} decoding: exact match {right / n:.1%}, {sum(steps) / len(steps):.2f} steps per "
              f"generated token", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
