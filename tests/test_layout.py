"""cyb.layout: pause vocabulary, Recipe 1 and 2 layouts, original TBYS data schemes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import reference as ref
from cyb.layout import (
    IGNORE_INDEX,
    PauseVocab,
    collapse,
    expand,
    expand_variable,
    insert_pauses,
    prompt_pause_slots,
    random_pause_slots,
    next_token_labels,
    sample_pause_counts,
)
from cyb.losses import cyb_loss

N = IGNORE_INDEX
X1, X2, X3, X4 = 5, 6, 7, 8
P1, P2, P3 = 20, 21, 22
DK = 23
V = 30


def vocab(m=3, scheme="shared", dk=DK):
    pauses = (P1, P2, P3)[: m - 1] if scheme == "shared" else (P1,) * (m - 1)
    return PauseVocab(num_steps=m, pause_ids=pauses, dk_id=dk, vocab_size=V, position_scheme=scheme)


def rows(*xs):
    return torch.tensor([list(x) for x in xs])


# ----------------------------------------------------------------------------- Recipe 1


def test_worked_example_shared_positions():
    e = expand(rows([X1, X2, X3]), vocab(3))
    assert e.input_ids.tolist() == [[X1, P1, P2, X2, P1, P2, X3, P1, P2]]
    assert e.position_ids.tolist() == [[0, 0, 0, 1, 1, 1, 2, 2, 2]]
    assert e.labels.tolist() == [[X2, X2, X2, X3, X3, X3, N, N, N]]
    assert e.attention_mask.tolist() == [[1] * 9]
    assert e.block_labels.tolist() == [[X2, X3, N]]
    assert e.num_steps == 3


def test_advance_scheme_positions_and_shared_pause_id():
    e = expand(rows([X1, X2, X3]), vocab(3, "advance"))
    assert e.input_ids.tolist() == [[X1, P1, P1, X2, P1, P1, X3, P1, P1]]
    assert e.position_ids.tolist() == [list(range(9))]
    assert e.labels.tolist() == [[X2, X2, X2, X3, X3, X3, N, N, N]]


def test_one_step_is_the_plain_sequence():
    ids = rows([X1, X2, X3, X4])
    e = expand(ids, PauseVocab(num_steps=1, vocab_size=V))
    assert torch.equal(e.input_ids, ids)
    assert e.position_ids.tolist() == [[0, 1, 2, 3]]
    assert e.labels.tolist() == [[X2, X3, X4, N]]


def test_right_padding():
    pad = 0
    e = expand(rows([X1, X2, X3], [X1, X2, pad]), vocab(2), attention_mask=rows([1, 1, 1], [1, 1, 0]))
    assert e.input_ids.tolist()[1] == [X1, P1, X2, P1, pad, P1]
    assert e.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 1, 0, 0]]
    assert e.position_ids.tolist()[0] == [0, 0, 1, 1, 2, 2]
    assert e.position_ids.tolist()[1][:4] == [0, 0, 1, 1]
    assert e.labels.tolist() == [[X2, X2, X3, X3, N, N], [X2, X2, N, N, N, N]]


def test_left_padding_masks_and_positions():
    pad = 0
    e = expand(rows([pad, X1, X2]), vocab(2), attention_mask=rows([0, 1, 1]))
    assert e.input_ids.tolist() == [[pad, P1, X1, P1, X2, P1]]
    assert e.attention_mask.tolist() == [[0, 0, 1, 1, 1, 1]]
    assert e.position_ids.tolist()[0][2:] == [0, 0, 1, 1]  # real tokens count from 0
    assert e.labels.tolist()[0][2:] == [X2, X2, N, N]


def test_left_padding_has_no_targets_at_padding():
    """A padded (masked) block has no input to predict from: its label must be ignored."""
    pad = 0
    mask = rows([0, 1, 1])
    e = expand(rows([pad, X1, X2]), vocab(2), attention_mask=mask)
    assert e.labels.tolist() == [[N, N, X2, X2, N, N]]
    assert e.block_labels.tolist() == [[N, X2, N]]
    assert next_token_labels(rows([pad, X1, X2]), mask).tolist() == [[N, X2, N]]


def test_advance_scheme_with_padding():
    e = expand(rows([0, X1, X2]), vocab(2, "advance"), attention_mask=rows([0, 1, 1]))
    assert e.position_ids.tolist()[0][2:] == [0, 1, 2, 3]
    e = expand(rows([X1, X2, 0]), vocab(2, "advance"), attention_mask=rows([1, 1, 0]))
    assert e.position_ids.tolist()[0][:4] == [0, 1, 2, 3]


@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("scheme", ["shared", "advance"])
def test_collapse_expand_round_trip(m, scheme):
    ids = torch.randint(0, 20, (3, 5), generator=torch.Generator().manual_seed(m))
    e = expand(ids, vocab(m, scheme))
    assert e.input_ids.shape == (3, 5 * m)
    grid = collapse(e.input_ids, m)
    assert grid.shape == (3, 5, m)
    assert torch.equal(grid[:, :, 0], ids)
    assert (grid[:, :, 1:] == torch.tensor(vocab(m, scheme).pause_ids)).all()
    labels = collapse(e.labels, m)
    assert (labels == e.block_labels.unsqueeze(-1)).all()
    h = torch.randn(3, 5 * m, 4)
    assert torch.equal(collapse(h, m).reshape(3, 5 * m, 4), h)
    j = m - 1
    assert torch.equal(collapse(h, m)[:, 2, j], h[:, 2 * m + j])
    if scheme == "shared":
        assert (collapse(e.position_ids, m) == torch.arange(5).view(1, 5, 1)).all()


def test_collapse_rejects_a_length_not_a_multiple_of_m():
    with pytest.raises(ValueError, match="M = 3"):
        collapse(torch.zeros(2, 7), 3)


def test_loss_mask_marks_the_tokens_to_predict():
    ids = rows([X1, X2, X3, X4])
    e = expand(ids, vocab(2), loss_mask=rows([0, 0, 1, 1]))
    assert e.block_labels.tolist() == [[N, X3, X4, N]]  # the prompt's last token predicts X3
    assert e.labels.tolist() == [[N, N, X3, X3, X4, X4, N, N]]


# ------------------------------------------------------------------------------- vocab


def test_vocab_errors_name_the_argument():
    with pytest.raises(ValueError, match="num_steps"):
        PauseVocab(num_steps=0, vocab_size=V)
    with pytest.raises(ValueError, match="num_steps"):
        PauseVocab(num_steps=-1, vocab_size=V)
    with pytest.raises(ValueError, match="pause_ids"):
        PauseVocab(num_steps=3, pause_ids=(P1,), vocab_size=V)
    with pytest.raises(ValueError, match=r"pause_ids\[1\]"):
        PauseVocab(num_steps=3, pause_ids=(P1, V), vocab_size=V)
    with pytest.raises(ValueError, match=r"pause_ids\[0\]"):
        PauseVocab(num_steps=2, pause_ids=(-1,), vocab_size=V)
    with pytest.raises(ValueError, match="dk_id"):
        PauseVocab(num_steps=2, pause_ids=(P1,), dk_id=V + 3, vocab_size=V)
    with pytest.raises(ValueError, match="dk_id.*collides"):
        PauseVocab(num_steps=3, pause_ids=(P1, P2), dk_id=P2, vocab_size=V)
    with pytest.raises(ValueError, match="pause_ids.*distinct"):
        PauseVocab(num_steps=3, pause_ids=(P1, P1), vocab_size=V)
    with pytest.raises(ValueError, match="position_scheme"):
        PauseVocab(num_steps=2, pause_ids=(P1,), vocab_size=V, position_scheme="nope")
    with pytest.raises(ValueError, match="vocab_size"):
        PauseVocab(num_steps=2, pause_ids=(P1,))


def test_special_ids():
    assert vocab(3).special_ids == {P1, P2, DK}
    assert vocab(3, dk=None).special_ids == {P1, P2}


def test_real_ids_outside_vocabulary_or_colliding_with_pauses():
    v = vocab(3)
    with pytest.raises(ValueError, match="token id 30 is outside the vocabulary"):
        expand(rows([X1, V]), v)
    with pytest.raises(ValueError, match="token id -2 is outside the vocabulary"):
        expand(rows([-2, X1]), v)
    with pytest.raises(ValueError, match=f"token id {P2} .*pause"):
        expand(rows([X1, P2]), v)
    with pytest.raises(ValueError, match=f"token id {DK} .*dk"):
        expand(rows([DK, X1]), v)
    with pytest.raises(ValueError, match=f"token id {P1} .*pause"):
        expand_variable(rows([X1, P1]), rows([0, 0]), v)
    # Padding is not checked: a masked pad may use any id.
    expand(rows([X1, P1]), v, attention_mask=rows([1, 0]))
    expand(rows([X1, P2]), v, check_ids=False)


def test_expand_shape_errors():
    v = vocab(2)
    with pytest.raises(ValueError, match="ids"):
        expand(torch.tensor([X1, X2]), v)
    with pytest.raises(ValueError, match="attention_mask"):
        expand(rows([X1, X2]), v, attention_mask=rows([1, 1, 1]))
    with pytest.raises(ValueError, match="loss_mask"):
        expand(rows([X1, X2]), v, loss_mask=rows([1]))
    with pytest.raises(ValueError, match="pause_counts"):
        expand_variable(rows([X1, X2]), rows([0, 0, 0]), v)
    with pytest.raises(ValueError, match=r"pause_counts.*\[0, 1\]"):
        expand_variable(rows([X1, X2]), rows([0, 2]), v)
    with pytest.raises(ValueError, match=r"pause_counts"):
        expand_variable(rows([X1, X2]), rows([-1, 0]), v)


# ----------------------------------------------------------------------------- Recipe 2


def test_sample_pause_counts_seeded():
    omega = [0.2, 0.5, 0.3]
    a = sample_pause_counts((4, 9), omega, generator=torch.Generator().manual_seed(1))
    b = sample_pause_counts((4, 9), omega, generator=torch.Generator().manual_seed(1))
    assert a.shape == (4, 9) and a.dtype == torch.long
    assert torch.equal(a, b)
    assert a.min() >= 0 and a.max() <= 2


def test_sample_pause_counts_follow_omega():
    omega = [0.5, 0.2, 0.0, 0.3]  # W - 1 = 2 never drawn
    n = 20000
    c = sample_pause_counts((n,), omega, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(c, minlength=4).double()
    assert freq[2] == 0
    p = torch.tensor(omega, dtype=torch.float64)
    keep = p > 0
    expected = n * p[keep]
    chi2 = float(((freq[keep] - expected) ** 2 / expected).sum())
    assert chi2 < 20.0  # 2 degrees of freedom: P(chi2 > 20) ~ 5e-5
    # Unnormalised omega is normalised.
    c2 = sample_pause_counts((n,), [5, 2, 0, 3], generator=torch.Generator().manual_seed(0))
    assert torch.equal(c, c2)


@pytest.mark.parametrize("bad, match", [
    ([0.5, -0.5, 1.0], "omega.*non-negative"),
    ([0.0, 0.0], "omega.*(zero|positive)"),
])
def test_sample_pause_counts_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        sample_pause_counts((3,), bad)


def hand_example():
    """Row 0: a, b, c with 2, 0, 1 pauses; row 1: a, b, c with none (right-padded)."""
    ids = rows([X1, X2, X3], [X2, X3, X4])
    counts = rows([2, 0, 1], [0, 0, 0])
    return expand_variable(ids, counts, vocab(3), pad_id=0), ids, counts


def test_expand_variable_hand_example():
    e, _, _ = hand_example()
    assert e.input_ids.tolist() == [[X1, P1, P2, X2, X3, P1], [X2, X3, X4, 0, 0, 0]]
    assert e.position_ids.tolist()[0] == [0, 0, 0, 1, 2, 2]
    assert e.position_ids.tolist()[1][:3] == [0, 1, 2]
    assert e.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    assert e.labels.tolist() == [[X2, X2, X2, X3, N, N], [X3, X4, N, N, N, N]]
    assert e.grid_index.tolist()[0] == [[0, 1, 2], [3, 0, 0], [4, 5, 0]]
    assert e.grid_index.tolist()[1] == [[0, 0, 0], [1, 0, 0], [2, 0, 0]]
    assert e.step_mask.tolist()[0] == [[True, True, True], [True, False, False], [True, True, False]]
    assert e.last_step.tolist()[0] == [[False, False, True], [True, False, False], [False, True, False]]
    assert e.last_step.tolist()[1] == [[True, False, False]] * 3
    assert e.world_stop.tolist() == [[3, 1, 2], [1, 1, 1]]
    assert e.block_labels.tolist() == [[X2, X3, N], [X3, X4, N]]
    assert e.num_steps == 3


def test_expand_variable_advance_scheme():
    e = expand_variable(rows([X1, X2, X3]), rows([2, 0, 1]), vocab(3, "advance"))
    assert e.input_ids.tolist() == [[X1, P1, P1, X2, X3, P1]]
    assert e.position_ids.tolist() == [[0, 1, 2, 3, 4, 5]]


def test_expand_variable_with_all_max_counts_is_recipe_1():
    ids = torch.randint(0, 20, (2, 4), generator=torch.Generator().manual_seed(3))
    e1 = expand(ids, vocab(3))
    e2 = expand_variable(ids, torch.full_like(ids, 2), vocab(3))
    for name in ("input_ids", "position_ids", "attention_mask", "labels"):
        assert torch.equal(getattr(e1, name), getattr(e2, name)), name
    assert (e2.world_stop == 3).all()


def test_gather_and_world_omega():
    e, _, _ = hand_example()
    t = e.input_ids.shape[1]
    x = torch.arange(2 * t).view(2, t) * 10
    got = e.gather(x)
    assert got.shape == (2, 3, 3)
    assert torch.equal(got[e.step_mask], (x.gather(1, e.grid_index.view(2, -1)).view(2, 3, 3))[e.step_mask])
    assert got[0].tolist() == [[0, 10, 20], [30, 0, 0], [40, 50, 0]]
    h = torch.randn(2, t, 5)
    gh = e.gather(h)
    assert gh.shape == (2, 3, 3, 5)
    assert torch.equal(gh[0, 2, 1], h[0, 5])
    omega = e.world_omega()
    assert omega.shape == (2, 3, 3)
    assert omega[0].tolist() == [[0, 0, 1], [1, 0, 0], [0, 1, 0]]
    assert torch.equal(omega.bool(), e.last_step)


def test_world_omega_in_cyb_loss_is_cyb_with_d_zero_at_the_last_step():
    """Recipe 2: model outputs at the laid-out steps, gathered to ``[B, L, M]``; CYB with
    ``omega = world_omega()`` equals the reference run on each token's own W steps with
    ``d_W = 0``."""
    m = 4
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, 20, (3, 6), generator=g)
    counts = sample_pause_counts(ids.shape, [0.3, 0.1, 0.2, 0.4], generator=g)
    e = expand_variable(ids, counts, vocab(m))
    t_len = e.input_ids.shape[1]
    # Per-position outputs of a pretend model.
    log_t_pos = F.logsigmoid(2 * torch.randn(3, t_len, generator=g, dtype=torch.float64))
    u = 2 * torch.randn(3, t_len, generator=g, dtype=torch.float64)
    log_t, log_d, log_not_d = (e.gather(x) for x in (log_t_pos, F.logsigmoid(u), F.logsigmoid(-u)))
    got = cyb_loss(log_t, log_d, log_not_d, omega=e.world_omega())
    for b in range(3):
        for k in range(6):
            w = int(counts[b, k]) + 1
            steps = e.grid_index[b, k, :w].tolist()
            t = [math.exp(float(log_t_pos[b, s])) for s in steps]
            d = [1 / (1 + math.exp(-float(u[b, s]))) for s in steps]
            d[-1] = 0.0  # Recipe 2: d forced to 0 at the token's last step
            want = -math.log(sum(si * ti for si, ti in zip(ref.stop_probs_eq2(d), t)))
            assert float(got[b, k]) == pytest.approx(want, rel=1e-10, abs=1e-12)
            assert want == pytest.approx(ref.cyb_loss(t, d), rel=1e-12)


# ------------------------------------------------------------------ original TBYS schemes


def test_random_pause_slots_insert_pauses_between_real_tokens():
    ids = torch.arange(1, 13).view(2, 6)
    pid = 99
    gens = [torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)]
    s = insert_pauses(ids, pid, lambda r, n, target: random_pause_slots(n, 4, gens[r]))
    assert s.input_ids.shape == (2, 10)
    assert s.position_ids.tolist() == [list(range(10))] * 2
    assert (s.attention_mask == 1).all()
    for r in range(2):
        seq = s.input_ids[r]
        is_pause = seq == pid
        assert int(is_pause.sum()) == 4
        assert not is_pause[0]
        assert torch.equal(seq[~is_pause], ids[r])  # real tokens in order
        for k in range(10):
            # label: the next input when it is real, else ignored ("skip the loss on pauses").
            want = int(seq[k + 1]) if k + 1 < 10 and not is_pause[k + 1] else N
            assert int(s.labels[r, k]) == want
        # Every real token but the first is predicted exactly once, by the step before it.
        assert sorted(x for x in s.labels[r].tolist() if x != N) == ids[r, 1:].tolist()
    again = insert_pauses(ids, pid, lambda r, n, t: random_pause_slots(n, 4, torch.Generator().manual_seed(5 + r)))
    assert torch.equal(again.input_ids, s.input_ids)
    none = insert_pauses(ids, pid, lambda r, n, t: random_pause_slots(n, 0))
    assert torch.equal(none.input_ids, ids)
    with pytest.raises(ValueError, match="pauses must be >= 0"):
        random_pause_slots(6, -1)


def test_prompt_pause_slots_put_pauses_before_the_answer():
    ids = rows([1, 2, 3, 7, 8], [4, 5, 6, 9, 10])
    answer = torch.tensor([[0, 0, 0, 1, 1]] * 2)
    s = insert_pauses(ids, 99, lambda r, n, target: prompt_pause_slots(target, 2), loss_mask=answer)
    assert s.input_ids.tolist() == [[1, 2, 3, 99, 99, 7, 8], [4, 5, 6, 99, 99, 9, 10]]
    assert s.position_ids.tolist() == [list(range(7))] * 2
    # Labels only on the answer; the last pause predicts its first token.
    assert s.labels.tolist() == [[N, N, N, N, 7, 8, N], [N, N, N, N, 9, 10, N]]
    s0 = insert_pauses(ids, 99, lambda r, n, target: prompt_pause_slots(target, 0), loss_mask=answer)
    assert s0.labels.tolist()[0] == [N, N, 7, 8, N]
    with pytest.raises(ValueError, match="pauses must be >= 0"):
        prompt_pause_slots(answer[0].bool(), -2)


def test_insert_pauses_drops_padding_and_right_pads():
    ids = rows([1, 2, 3, 0], [4, 5, 6, 7])
    mask = rows([1, 1, 1, 0], [1, 1, 1, 1])
    s = insert_pauses(ids, 99, lambda r, n, t: [1], attention_mask=mask)
    assert s.input_ids.tolist() == [[1, 99, 2, 3, 0], [4, 99, 5, 6, 7]]
    assert s.attention_mask.tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert s.labels.tolist() == [[N, 2, 3, N, N], [N, 5, 6, 7, N]]
