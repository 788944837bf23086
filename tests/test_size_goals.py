"""The serving goals at real sizes as MET / MISSED / N/A lines, from hand-made records."""

from __future__ import annotations

from cyb.bench.size_goals import goal_lines, goals_table, size_goals, size_table


def run(model="smollm2-1.7b", job="mixed", case="none", *, peak=230, tok_s=1000.0, ceiling=1200.0,
        itl=(2.0, 5.0), failed=0, prefix_off=None, preemptions=None, status="ok"):
    engine = {"real_tokens_per_s": tok_s, "slots_in_use_peak": peak, "slots_in_use_mean": peak * 0.8,
              "slots_in_use_mean_queued": peak * 0.9, "today_slots": 56, "cache_budget_gib": 40.0,
              "itl_ms_p50": itl[0], "itl_ms_p99": itl[1], "itl_p99_over_p50": itl[1] / itl[0],
              "itl_step_ms_p50": itl[0], "itl_step_ms_p99": itl[1], "mean_steps": 1.0, "ttft_ms_p50": 30.0,
              "ttft_ms_p99": 90.0, "failed": failed, "preemptions": preemptions, "prefix_hit_rate": None}
    r = {"kind": "serve_sizes_run", "model": model, "job": job, "case": case, "concurrency": 256, "status": status,
         "engine": engine, "ceiling_tok_s": ceiling, "vs_ceiling": tok_s / ceiling}
    if status != "ok":
        r.update(reason="time budget spent", engine=None)
    if prefix_off is not None:
        r["prefix_off"] = prefix_off
    return r


def lines_of(records):
    return goal_lines(size_goals(records))


def test_each_goal_met_missed_or_not_measured():
    records = [
        run(peak=230),
        run(case="private-adaptive", peak=150, itl=(2.0, 7.0)),
        run(model="gemma3-1b", peak=12, tok_s=500.0, ceiling=1000.0),  # no slots goal off 1.7 B
        run(job="fewshot", prefix_off={"status": "ok", "real_tokens_per_s": 250.0, "failed": 0}),
        run(job="fewshot", case="shared-fixed", prefix_off={"status": "n/a", "reason": "no option"}),
        {"kind": "serve_sizes_batch1", "model": "smollm2-1.7b", "status": "ok", "weight_bytes": 3_422_552_064,
         "weights_read_ms": 1.25, "copy": {"bytes_per_s": 2.74e12}, "cases": {"none": {"status": "ok",
                                                                                     "ms_per_token": 1.5}}},
        {"kind": "serve_sizes_preemption", "model": "smollm2-1.7b", "case": "none", "status": "ok",
         "check": {"preemptions": 12, "failed": 0, "changed": 1, "noise": 0, "requests": 64}},
        {"kind": "serve_sizes_preemption", "model": "smollm2-1.7b", "case": "private-adaptive", "status": "ok",
         "check": {"preemptions": None, "failed": 0, "changed": 0, "noise": 0, "requests": 64}},
    ]
    lines = lines_of(records)
    assert lines[0].startswith("MET    slots in use at C=256 >= 200 (smollm2-1.7b, mixed, none): 230 (needed >= 200)")
    assert "one slot of max_model_len per request: 56 slots in 40.0 GiB" in lines[0]
    assert lines[1].startswith("MISSED slots in use at C=256 >= 200 (smollm2-1.7b, mixed, private-adaptive): 150")
    assert not any("slots in use" in x and "gemma3-1b" in x for x in lines)
    assert "MET    engine tokens/s >= 0.75 x its ceiling (smollm2-1.7b, mixed, none): 0.833 (needed >= 0.75)" in lines
    assert "MISSED engine tokens/s >= 0.75 x its ceiling (gemma3-1b, mixed, none): 0.5 (needed >= 0.75)" in lines
    itl = [x for x in lines if "inter-token" in x]
    assert len(itl) == 5 and itl[1].startswith("MISSED inter-token p99 <= 3.0 x p50, per token "
                                               "(smollm2-1.7b, mixed, private-adaptive): 3.5")
    assert [x[:6].strip() for x in lines if "few-shot" in x] == ["MET", "N/A"]
    assert "4 (needed >= 3.0); 1,000 against 250 tokens/s" in next(x for x in lines if "few-shot" in x)
    assert any(x.startswith("N/A") and x.endswith("; no option") for x in lines if "few-shot" in x)
    batch1 = next(x for x in lines if "batch 1" in x)
    assert batch1.startswith("MET    batch 1 <= 1.3 x the time to read the weights once (smollm2-1.7b, no pauses): 1.2 ")
    assert "1.500 ms a token, weights 3.19 GiB read in 1.250 ms at 2.74 TB/s" in batch1
    pre = [x for x in lines if "preemption" in x]
    assert pre[0].startswith("MISSED no failed or changed request under preemption (smollm2-1.7b, none): 1 ")
    assert "12 preemptions, 0 failed, 1 changed of 64; 0 differ at half the rows" in pre[0]
    assert pre[1].startswith("N/A") and "the engine does not preempt; 0 failed, 0 changed" in pre[1]
    assert lines[-1] == "MET    no failed request in any run (5 runs): 0 (needed == 0)"


def test_failed_and_skipped_runs_show_as_missed_or_not_measured():
    records = [run(failed=2), run(case="shared-fixed", status="skipped")]
    lines = lines_of(records)
    assert lines[1].startswith("N/A    slots in use") and lines[1].endswith("; skipped: time budget spent")
    assert lines[-1] == "MISSED no failed request in any run (1 runs): 2 (needed == 0)"
    table = size_table(records)
    assert "| smollm2-1.7b | mixed | shared-fixed | skipped: time budget spent |" in table
    assert "| smollm2-1.7b | mixed | none | 1,000 | 1,200 | 0.83 |" in table
    assert "| goal | value | needed | status |" in goals_table(size_goals(records))


def test_the_anchor_sits_beside_the_run_without_pauses():
    anchor = {"kind": "serve_sizes_anchor", "model": "smollm2-1.7b", "job": "mixed", "status": "ok",
              "anchor": {"status": "ok", "real_tokens_per_s": 812.4}}
    table = size_table([run(), run(case="private-adaptive"), anchor]).splitlines()
    assert table[2].split(" | ")[6] == "812" and table[3].split(" | ")[6] == ""


def test_preemption_reads_not_measured_where_a_different_batch_alone_changes_answers():
    """bf16 sums depend on the batch: where half the slots (nothing preempted) change answers too,
    the changed count says nothing about the cache, and the line says so."""
    def check(changed, noise, failed=0):
        return {"kind": "serve_sizes_preemption", "model": "smollm2-1.7b", "case": "none", "status": "ok",
                "check": {"preemptions": 3, "failed": failed, "changed": changed, "noise": noise, "requests": 64,
                          "dtype": "bfloat16"}}

    noisy, clean, broken = (lines_of([check(*c)])[0] for c in ((14, 21), (0, 3), (2, 5, 1)))
    assert noisy.startswith("N/A    no failed or changed request under preemption (smollm2-1.7b, none)")
    assert "14 changed of 64; 21 differ at half the rows with the large cache (bfloat16)" in noisy
    assert "equality is not read here" in noisy
    assert clean.startswith("MET    no failed or changed request under preemption (smollm2-1.7b, none): 0 ")
    assert broken.startswith("MISSED no failed or changed request under preemption (smollm2-1.7b, none): 3 ")
