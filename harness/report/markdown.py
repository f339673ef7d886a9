"""results.md: the report as a markdown page (published vs measured, lanes, reference, speed, timing).

Pure rendering of the report dict ``harness.report.results`` keeps; every reader of a report (the page, the
test report, the night's plan) formats its tables with the same helpers.
"""

from __future__ import annotations

import math

from harness.base.run_dir import provenance_state
from harness.declare.published import SOURCE


def interrupted_lines(mark: dict | None) -> list[str]:
    """The last command's interruption, first thing in results.md: what stopped it, where, what never started."""
    if not mark:
        return []
    never = ", ".join(mark.get("not_started") or []) or "none"
    return [
        f"**INTERRUPTED** by {mark['signal']} during the {mark['stage']}: what was measured before it is "
        f"below; runs never started: {never}.",
        "",
    ]


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.7g}"
    return str(value)


def _weights_cell(weights: dict | None) -> str:
    if weights is None:
        return "random init"
    return f"{weights['path']} ({weights['headers_sha256'][:12]})"


def _status(run: dict) -> str:
    """ok, or how the run ended, with the named state of what its ranks did not record."""
    state = provenance_state(run.get("provenance"), run.get("run_dir"))
    known = f"; {state}" if state and state not in (run.get("error") or "") else ""
    if run.get("interrupted"):
        during = f" during the {run['interrupted_stage']}" if run.get("interrupted_stage") else ""
        return f"INTERRUPTED ({run['interrupted']}){during} after {len(run.get('steps') or [])} step(s){known}"
    return f"FAILED: {run['error']}{known}" if run.get("error") else "ok"


def provenance_row(run: dict) -> list[str]:
    """One run's provenance cells; a run whose ranks wrote none (or part of it) names that state instead."""
    p = run["provenance"]
    state = provenance_state(p, run.get("run_dir"))
    if state is not None:
        return [run.get("recipe", "?"), run.get("init", "?"), *[f"– ({state})"] + ["–"] * 6]
    t, w, m, d = p["tokenizer"], p.get("weights"), p["model"], p["data"]
    return [
        run["recipe"],
        run["init"],
        f"{t['path']} ({t['vocab_size']}, {t['sha256'][:12]})",
        _weights_cell(w),
        f"{m['hidden_size']}/{m['num_hidden_layers']}/{m['num_attention_heads']}/{m['num_key_value_heads']}/"
        f"{m['vocab_size']}/{m['rope_theta']:g}/{m['tie_word_embeddings']}",
        f"{d['seq_len']}×{d['local_batch_size']} ({d['global_batch_size']})",
        p["seed"],
        p["dtype"]["params"],
        "; ".join(p["allowed_mismatches"]) or "–",
    ]


def reference_section(runs: list[dict]) -> list[str]:
    """Each weights-loaded run's step-1 loss beside transformers' on the same batch (harness.reference.diagnosis)."""
    checked = [r for r in runs if r.get("reference")]
    if not checked:
        return []
    lines = [
        "## Step-1 loss vs an independent reference",
        "",
        "Reference: the run's own first global batch (token ids, per-document positions, attention) scored by "
        "transformers' `AutoModelForCausalLM` from the same weights directory, fp32, on the host CPU, outside "
        "torchtitan. Plausible: at most ½ ln V for weights that were trained.",
        "",
    ]
    rows, notes, reasons = [], [], {}
    for r in checked:
        ref = r["reference"]
        name = f"{r['recipe']} ({r['tier']}, {r['nproc']} proc)"
        if ref.get("error"):
            verdict = ref["summary"] if ref.get("passed") is None else f"**FAIL: {ref['summary']}**"
            measured = _fmt(r["losses"][0] if r.get("losses") else None)
            rows.append([r["recipe"], r["tier"], "–", measured, "–", "–", "–", "–", verdict])
            continue
        verdict = (
            f"unmeasured: {ref['verdict']}"
            if ref["passed"] is None
            else ref["verdict"]
            if ref["passed"]
            else f"**FAIL: {ref['verdict']}**"
        )
        rows.append(
            [
                r["recipe"],
                r["tier"],
                ref["model_dir"],
                _fmt(ref["measured"]),
                _fmt(ref["reference"]),
                f"{ref['difference']:+.3g}",
                _fmt(ref["tolerance"]),
                f"{ref['plausible_bound']:.3f}",
                verdict,
            ]
        )
        reasons[ref["tolerance"]] = ref["tolerance_reason"]
        if ref.get("diagnosis"):
            notes.append(f"- diagnosis of {name}: {ref['diagnosis']}")
    header = [
        "recipe",
        "tier",
        "weights",
        "measured",
        "reference",
        "measured − reference",
        "tolerance",
        "½ ln V",
        "verdict",
    ]
    lines += md_table(header, rows)
    lines.append("")
    lines += [f"- tolerance {_fmt(value)}: {reason}" for value, reason in reasons.items()]
    lines += notes
    lines.append("")
    return lines


def first_divergence_section(runs: list[dict]) -> list[str]:
    """Each localized run: the first module where torchtitan's model and transformers' part, and the next three."""
    localized = [r for r in runs if (r.get("reference") or {}).get("localization")]
    if not localized:
        return []
    lines = [
        "## First divergence, by layer",
        "",
        "The run's first batch (rank 0, a prefix) through its torchtitan model and transformers' model on the host, "
        "fp32, module by module in forward order (harness.reference.localize: runs when step 1 disagrees with the "
        "reference, or with `--localize`).",
        "",
    ]
    for r in localized:
        loc = r["reference"]["localization"]
        lines.append(f"- {r['recipe']} ({r['tier']}): {loc['summary']}")
    return lines + [""]


# --- per config: published, as published, corrected, reference (the trn2 lanes) ------------------------


def _named(check: dict | None) -> str:
    """The suspects a reference diagnosis named, with their measured effects."""
    if not check:
        return "not diagnosed"
    named = [s for s in check.get("suspects", []) if s.get("explains")]
    still = [s["name"] for s in check.get("suspects", []) if s.get("applies")]
    if not named and still:
        return f"no measured suspect accounts for it; still suspect: {', '.join(still)}"
    if not named:
        return "none of the known suspects (tokenizer, rope_theta, inv_freq) accounts for it"
    return ", ".join(f"{s['name']} ({s['what']}; effect {s['effect']:+.3g})" for s in named)


def lane_summary(
    recipe: str,
    published: float,
    tolerance: float,
    as_published: dict | None,
    corrected: dict | None,
) -> dict:
    """One config's published number beside its as-published and corrected lanes and the host reference.

    ``as_published`` / ``corrected``: each lane's ``ReferenceCheck.to_dict()`` (None: the lane
    did not run). Every difference gets its named cause: the as-published lane's diagnosis
    says why it scores what it scores, the corrected lane is held to the reference.
    """
    row = {
        "recipe": recipe,
        "published": published,
        "tolerance": tolerance,
        "as_published": as_published and as_published["measured"],
        "corrected": corrected and corrected["measured"],
        "reference": corrected and corrected["reference"],
        "causes": {},
    }
    causes = row["causes"]
    if as_published is not None:
        delta = as_published["measured"] - published
        causes["as published vs published"] = (
            f"reproduced: |Δ| {abs(delta):.3g} ≤ {tolerance:g}"
            if math.isfinite(delta) and abs(delta) <= tolerance
            else f"not reproduced: Δ {delta:+.3g}; the as-published lane scores what its diagnosis names: "
            f"{_named(as_published)}"
        )
    if as_published is not None and corrected is not None:
        delta = as_published["measured"] - corrected["measured"]
        causes["as published vs corrected"] = f"Δ {delta:+.3g}: {_named(as_published)}"
    if corrected is not None:
        delta, tol = corrected["difference"], corrected["tolerance"]
        within = math.isfinite(delta) and abs(delta) <= tol
        judged = corrected.get("judged", True)
        verdict = "pass" if within else "FAIL"
        causes["corrected vs reference"] = (
            f"Δ {delta:+.3g} vs ±{tol:g} (bf16 on the device vs fp32 on the host): "
            + (
                verdict
                if judged
                else f"unmeasured (the tolerance is not measured yet; would {verdict.lower()})"
            )
            + ("" if within else f"; diagnosis: {_named(corrected)}")
        )
        row["corrected_verdict"] = verdict if judged else "unmeasured"
    return row


def lanes_section(summaries: list[dict]) -> list[str]:
    """The per-config table of :func:`lane_summary` rows, then each difference's named cause."""
    if not summaries:
        return []
    rows = [
        [
            s["recipe"],
            _fmt(s["published"]),
            _fmt(s["as_published"]),
            _fmt(s["corrected"]),
            _fmt(s["reference"]),
            s.get("corrected_verdict", "–"),
        ]
        for s in summaries
    ]
    header = [
        "config",
        "published",
        "as published (measured)",
        "corrected (measured)",
        "reference (host, fp32)",
        "corrected vs reference",
    ]
    lines = [
        "## Published numbers per config: as published, corrected, reference",
        "",
        *md_table(header, rows),
        "",
    ]
    for s in summaries:
        lines += [f"- {s['recipe']}, {what}: {cause}" for what, cause in s["causes"].items()]
    return lines + [""]


def run_timing(wall_s: float, runs: list[dict]) -> dict:
    """Where one ``python -m harness run`` spent its time: training steps, launches around them, and the rest."""
    launches_s = sum(r.get("wall_s") or 0.0 for r in runs)
    steps_s = sum(s.get("step_time_s") or 0.0 for r in runs for s in r.get("steps") or [])
    return {
        "wall_s": round(wall_s, 1),
        "launches_s": round(launches_s, 1),
        "training_steps_s": round(steps_s, 1),
        "outside_training_share": round(1 - steps_s / wall_s, 3) if wall_s > 0 else None,
    }


def timing_line(t: dict) -> str:
    share = t["outside_training_share"]
    return (
        f"Time of the last `python -m harness run`: {t['wall_s']:.0f} s wall; training steps {t['training_steps_s']:.0f} s; "
        f"torchrun launches {t['launches_s']:.0f} s (start-up, checkpoint load and save included); outside training "
        f"{'–' if share is None else f'{share:.0%}'} (imports, refusals, launches' start-up and exit, reference, report)."
    )


def speed_cells(speed: dict) -> list[str]:
    """MFU, time to the first step and NEFF cache state of a run (``harness.launch.speed``); "–" where not measured."""
    mfu, first = speed.get("mfu_pct"), speed.get("time_to_first_step_s")
    return [
        "n/a"
        if speed and speed.get("peak_tflops") is None
        else "–"
        if mfu is None
        else f"{mfu:.1f}%",
        "–" if first is None else f"{first:.1f}",
        speed.get("neff_cache", "–"),
    ]


def md_table(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table's lines (header, separator, rows) from cells already formatted as text."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows),
    ]


def markdown(report: dict) -> str:
    lines = [
        "# qwen3-trn-repro results",
        "",
        f"Published numbers: {report.get('source', SOURCE)}",
        "",
    ]
    lines += interrupted_lines(report.get("interrupted"))
    if report.get("checks"):
        lines += [
            "## Checks",
            "",
            "Lanes: **published**, the tutorial's number measured as the tutorial ran it (trn2); **proxy**, a cpu "
            "measurement standing in for a tutorial number (its reason says how it differs); **exact**, this "
            "lock's own value on the cpu tier (a regression check, not a tutorial number).",
            "",
        ]
        rows = []
        for c in report["checks"]:
            name = f"{c['key']} ({c['claim']})" if c.get("claim") else c["key"]
            verdict = (
                c.get("verdict") or {True: "pass", False: "FAIL", None: "recorded"}[c["passed"]]
            )
            verdict = verdict if c["passed"] is not False else f"**FAIL: {verdict}**"
            rows.append(
                [
                    name,
                    c.get("lane", "–"),
                    _fmt(c.get("published")),
                    _fmt(c.get("golden")),
                    _fmt(c["measured"]),
                    _fmt(c["tolerance"]),
                    verdict,
                ]
            )
        header = [
            "check",
            "lane",
            "published (tutorial)",
            "golden (this lock)",
            "measured",
            "tolerance",
            "verdict",
        ]
        lines += md_table(header, rows)
        lines.append("")
        reasons = [(c["key"], c["reason"]) for c in report["checks"] if c.get("reason")]
        lines += [f"- `{key}`: {reason}" for key, reason in reasons] + ([""] if reasons else [])
    lines += reference_section(report.get("runs", []))
    lines += first_divergence_section(report.get("runs", []))
    if report.get("runs"):
        rows = []
        for r in report["runs"]:
            steps = r.get("steps") or []
            tps = [s["tokens_per_s"] for s in steps[1:]] or [s["tokens_per_s"] for s in steps]
            times = [s["step_time_s"] for s in steps[1:]] or [s["step_time_s"] for s in steps]
            rows.append(
                [
                    r["recipe"],
                    r["tier"],
                    r["init"],
                    r["nproc"],
                    f"{r['seq_len']}×{r['local_batch_size']}",
                    _fmt(r["losses"][0] if r["losses"] else None),
                    _fmt(r["losses"][-1] if r["losses"] else None),
                    len(steps),
                    f"{sum(tps) / len(tps):,.0f}" if tps else "–",
                    f"{sum(times) / len(times):.3f}" if times else "–",
                    *speed_cells(r.get("speed") or {}),
                    _status(r),
                ]
            )
        header = [
            "recipe",
            "tier",
            "init",
            "procs",
            "seq×batch",
            "step-1 loss",
            "last loss",
            "steps",
            "tokens/s",
            "s/step",
            "MFU",
            "to step 1 (s)",
            "NEFF cache",
            "status",
        ]
        lines += ["## Runs", ""] + md_table(header, rows)
        lines.append("")
        peaks = {
            (r["speed"]["peak_tflops"], r["speed"]["peak_source"])
            for r in report["runs"]
            if (r.get("speed") or {}).get("peak_tflops")
        }
        lines += [
            f"MFU against a peak of {p:g} TFLOPS per rank ({source})."
            for p, source in sorted(peaks)
        ]
        lines += [""] if peaks else []
    if report.get("loss_curves"):
        lines += ["## Loss curves", ""]
        lines += [f"- [{name}]({png})" for name, png in report["loss_curves"].items()]
        lines.append("")
    runs_with_provenance = [r for r in report.get("runs", []) if r.get("provenance")]
    if runs_with_provenance:
        rows = [provenance_row(r) for r in runs_with_provenance]
        header = [
            "recipe",
            "init",
            "tokenizer (V, sha256)",
            "weights (headers sha256)",
            "model d/L/H/KV/V/θ/tied",
            "data seq×local (global)",
            "seed",
            "dtype",
            "allowed mismatches",
        ]
        lines += ["## Provenance", ""] + md_table(header, rows)
        lines.append("")
    v = report.get("versions", {})
    if report.get("timing"):
        lines += [timing_line(report["timing"]), ""]
    lines += ["Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val), ""]
    return "\n".join(lines)
