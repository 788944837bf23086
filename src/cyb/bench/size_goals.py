"""The serving goals at real sizes, each a MET, MISSED or N/A line computed from the JSON that
``benchmarks/serve_sizes.py`` writes, and the table of its runs.

The records (one dict per JSON file, any number of calls together) are of four kinds:
``serve_sizes_run`` (one model, job and case through the engine), ``serve_sizes_batch1``,
``serve_sizes_anchor`` (transformers' continuous batching) and ``serve_sizes_preemption``.

Goals:

* slots in use at ``C`` = 256 on the mixed job at 1.7 B: at least :data:`SLOTS_GOAL` (the
  engine's peak over steps; the note gives the mean and what one slot of ``max_model_len`` per
  request allows in the same bytes);
* the engine at least :data:`CEILING_GOAL` x its ceiling on every job, size and case;
* inter-token p99 at most :data:`ITL_GOAL` x p50, counted per token, in every case (these two
  also for ``cyb serve``, where the run went through it);
* the few-shot job at least :data:`PREFIX_GOAL` x faster with prefix caching than without;
* batch 1 at 1.7 B at most :data:`BATCH1_GOAL` x the time to read the weights once at the card's
  copy bandwidth;
* no failed or changed request under preemption (N/A where a different batch alone, nothing
  preempted, changes answers too: then the numerics, not the cache, decide), and no failed
  request anywhere.
"""

from __future__ import annotations

from .markdown import markdown_table
from .targets import _check

SLOTS_GOAL = 200
CEILING_GOAL = 0.75
ITL_GOAL = 3.0
PREFIX_GOAL = 3.0
BATCH1_GOAL = 1.3
#: the model and job of the slots goal, and the model of the batch-1 goal
GOAL_MODEL = "smollm2-1.7b"
SLOTS_JOB = "mixed"


def _runs(records, kind: str) -> list[dict]:
    return [r for r in records if r.get("kind") == kind]


def _label(r: dict) -> str:
    return f"{r['model']}, {r['job']}, {_case(r)}"


def _case(r: dict) -> str:
    """The run's case, with the engine options of its variant (``--variants``) where it has one."""
    return f"{r['case']} [{r['variant']}]" if r.get("variant") else r["case"]


def _missing(target: str, op: str, threshold, r: dict) -> dict:
    return _check(target, None, op, threshold, f"{r.get('status')}: {r.get('reason', '')}".rstrip(": "))


def size_goals(records) -> list[dict]:
    """The checks (:func:`cyb.bench.targets._check` dicts) of ``records``."""
    out = []
    runs = _runs(records, "serve_sizes_run")
    for r in runs:
        if r["model"] != GOAL_MODEL or r["job"] != SLOTS_JOB:
            continue
        target = f"slots in use at C={r.get('concurrency')} >= {SLOTS_GOAL} ({_label(r)})"
        e = r.get("engine") or {}
        if r.get("status") != "ok":
            out.append(_missing(target, ">=", SLOTS_GOAL, r))
            continue
        note = (f"mean {e['slots_in_use_mean']:.0f} over steps, {_fmt(e.get('slots_in_use_mean_queued'), '.0f')} "
                f"while requests waited; one slot of max_model_len per request: {e['today_slots']} slots in "
                f"{e['cache_budget_gib']:.1f} GiB")
        out.append(_check(target, e["slots_in_use_peak"], ">=", SLOTS_GOAL, note))
    for r in runs:
        target = f"engine tokens/s >= {CEILING_GOAL} x its ceiling ({_label(r)})"
        if r.get("status") != "ok":
            out.append(_missing(target, ">=", CEILING_GOAL, r))
            continue
        note = "" if r.get("vs_ceiling") is not None else "ceiling not measured"
        out.append(_check(target, r.get("vs_ceiling"), ">=", CEILING_GOAL, _join(note, _early(r["engine"]))))
        if r.get("serve_vs_ceiling") is not None:
            out.append(_check(f"served tokens/s >= {CEILING_GOAL} x the ceiling ({_label(r)})",
                              r["serve_vs_ceiling"], ">=", CEILING_GOAL, f"{r['serve_vs_engine']:.2f} x the engine"))
    for r in runs:
        target = f"inter-token p99 <= {ITL_GOAL} x p50, per token ({_label(r)})"
        if r.get("status") != "ok":
            out.append(_missing(target, "<=", ITL_GOAL, r))
            continue
        e = r["engine"]
        note = f"{_fmt(e['itl_ms_p50'], '.2f')} / {_fmt(e['itl_ms_p99'], '.2f')} ms"
        if e.get("itl_step_ms_p50") and e.get("mean_steps", 1) > 1.001:
            note += f"; per decoding step {e['itl_step_ms_p99'] / e['itl_step_ms_p50']:.2f}"
        out.append(_check(target, e.get("itl_p99_over_p50"), "<=", ITL_GOAL, _join(note, _early(e))))
        served = r.get("serve") or {}
        if served.get("status") == "ok":
            ms = f"{_fmt(served['itl_token_ms_p50'], '.2f')} / {_fmt(served['itl_token_ms_p99'], '.2f')} ms"
            out.append(_check(f"served inter-token p99 <= {ITL_GOAL} x p50, per token ({_label(r)})",
                              served.get("itl_token_p99_over_p50"), "<=", ITL_GOAL, ms))
    for r in runs:
        if r["job"] != "fewshot":
            continue
        target = f"few-shot job >= {PREFIX_GOAL} x faster with prefix caching ({r['model']}, {_case(r)})"
        if r.get("status") != "ok":
            out.append(_missing(target, ">=", PREFIX_GOAL, r))
            continue
        off = r.get("prefix_off") or {}
        if off.get("status") != "ok":
            why = off.get("reason") or "the engine has no prefix_caching option"
            out.append(_check(target, None, ">=", PREFIX_GOAL, why))
            continue
        on = r["engine"]
        rate = on.get("prefix_hit_rate")
        out.append(_check(target, on["real_tokens_per_s"] / off["real_tokens_per_s"], ">=", PREFIX_GOAL,
                          f"{on['real_tokens_per_s']:,.0f} against {off['real_tokens_per_s']:,.0f} tokens/s"
                          + (f"; prefix hit rate {rate:.2f}" if rate is not None else "")))
    for b in _runs(records, "serve_sizes_batch1"):
        target = f"batch 1 <= {BATCH1_GOAL} x the time to read the weights once ({b['model']}, no pauses)"
        one = (b.get("cases") or {}).get("none") or {}
        read = b.get("weights_read_ms")
        if one.get("status") != "ok" or read is None:
            why = "no CUDA copy bandwidth" if read is None else f"batch 1: {one.get('status', 'not run')}"
            out.append(_check(target, None, "<=", BATCH1_GOAL, why))
            continue
        out.append(_check(target, one["ms_per_token"] / read, "<=", BATCH1_GOAL,
                          f"{one['ms_per_token']:.3f} ms a token, weights {b['weight_bytes'] / 2**30:.2f} GiB read in "
                          f"{read:.3f} ms at {b['copy']['bytes_per_s'] / 1e12:.2f} TB/s"))
    for p in _runs(records, "serve_sizes_preemption"):
        target = f"no failed or changed request under preemption ({p['model']}, {p['case']})"
        c = p.get("check") or {}
        if p.get("status") != "ok":
            out.append(_missing(target, "==", 0, p))
        elif not c.get("preemptions"):
            why = ("the engine does not preempt" if c.get("preemptions") is None
                   else "the small cache preempted nothing")
            out.append(_check(target, None, "==", 0, f"{why}; {c['failed']} failed, {c['changed']} changed"))
        else:
            note = (f"{c['preemptions']} preemptions, {c['failed']} failed, {c['changed']} changed of {c['requests']}; "
                    f"{c['noise']} differ at half the rows with the large cache ({c.get('dtype', 'bfloat16')})")
            if c["changed"] and c["noise"] and not c["failed"]:
                # a different batch alone changes answers: equality cannot be read at this size
                out.append(_check(target, None, "==", 0, note + "; the numerics of a different batch "
                                  "change answers alone, so equality is not read here (the GPU tests hold it)"))
            else:
                out.append(_check(target, c["failed"] + c["changed"], "==", 0, note))
    done = [r for r in runs if r.get("status") == "ok"]
    if done:
        failed = sum(r["engine"]["failed"] + (r.get("prefix_off") or {}).get("failed", 0)
                     + (r.get("serve") or {}).get("errors", 0) for r in done)
        out.append(_check(f"no failed request in any run ({len(done)} runs)", failed, "==", 0))
    return out


def _early(engine: dict) -> str:
    return "the run was stopped at the time budget" if engine.get("stopped_early") else ""


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def goal_lines(checks) -> list[str]:
    """One line per check: ``MET``, ``MISSED`` or ``N/A``, the target, its value and what is
    needed, and the note."""
    lines = []
    for c in checks:
        status = "N/A" if c["met"] is None else "MET" if c["met"] else "MISSED"
        value = c["value"]
        shown = "n/a" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)
        note = f"; {c['note']}" if c.get("note") else ""
        lines.append(f"{status:<6} {c['target']}: {shown} (needed {c['op']} {c['threshold']}){note}")
    return lines


def size_table(records) -> str:
    """The Markdown table of the runs: one line per model, job, case and variant."""
    headers = ["model", "job", "case", "tok/s", "ceiling tok/s", "/ ceiling", "transformers CB tok/s", "served tok/s",
               "slots peak / mean", "one slot of max_model_len", "ITL p50 / p99 ms", "p99 / p50", "TTFT p50 / p99 ms",
               "prefix off tok/s", "prefix hit rate", "preemptions", "failed"]
    anchors = {(a["model"], a["job"]): a.get("anchor") or {} for a in _runs(records, "serve_sizes_anchor")}
    rows = []
    for r in _runs(records, "serve_sizes_run"):
        head = [r["model"], r["job"], _case(r)]
        if r.get("status") != "ok":
            rows.append(head + [f"{r.get('status')}: {r.get('reason', '')}"[:80]] + [""] * (len(headers) - 4))
            continue
        e, off, served = r["engine"], r.get("prefix_off") or {}, r.get("serve") or {}
        anchor = anchors.get((r["model"], r["job"]), {}) if r["case"] == "none" and not r.get("variant") else {}
        rows.append(head + [
            _fmt(e["real_tokens_per_s"], ",.0f"), _fmt(r.get("ceiling_tok_s"), ",.0f"),
            _fmt(r.get("vs_ceiling"), ".2f"),
            _fmt(anchor.get("real_tokens_per_s"), ",.0f") if anchor else "",
            _fmt(served.get("real_tokens_per_s"), ",.0f") if served.get("status") == "ok" else "",
            f"{e['slots_in_use_peak']} / {_fmt(e['slots_in_use_mean'], '.0f')}", _fmt(e.get("today_slots"), "d"),
            f"{_fmt(e['itl_ms_p50'], '.2f')} / {_fmt(e['itl_ms_p99'], '.2f')}",
            _fmt(e.get("itl_p99_over_p50"), ".2f"),
            f"{_fmt(e['ttft_ms_p50'], '.0f')} / {_fmt(e['ttft_ms_p99'], '.0f')}",
            _fmt(off.get("real_tokens_per_s"), ",.0f") if off.get("status") == "ok" else "n/a",
            _fmt(e.get("prefix_hit_rate"), ".2f"), _fmt(e.get("preemptions"), "d"), e["failed"]])
    return markdown_table(headers, rows)


def goals_table(checks) -> str:
    """The checks as a Markdown table (target, value, needed, status), for the record page."""
    rows = []
    for c in checks:
        status = "n/a" if c["met"] is None else "**met**" if c["met"] else "**missed**"
        value = "n/a" if c["value"] is None else f"{c['value']:.3g}" if isinstance(c["value"], float) else c["value"]
        note = f" ({c['note']})" if c["note"] else ""
        rows.append([c["target"], value, f"{c['op']} {c['threshold']}", status + note])
    return markdown_table(["goal", "value", "needed", "status"], rows)


__all__ = ["BATCH1_GOAL", "CEILING_GOAL", "ITL_GOAL", "PREFIX_GOAL", "SLOTS_GOAL", "goal_lines", "goals_table",
           "size_goals", "size_table"]
