//! `tune` as text: where the profile is, the search space, the slot races, the
//! end-to-end combinations and the decision among them, with its reason.

use tabled::Tabled;

use super::{Report, sharp_table};
use crate::report::TuneReport;

impl Report for TuneReport {
    fn table(&self) -> String {
        let r = self;
        let mut s = String::new();
        s.push_str(&format!("model:    {}\ndevice:   {}\n", r.model, r.device));
        s.push_str(&format!("profile:  {}{}\n", r.path.display(), if r.cached { " (cached; --force re-tunes)" } else { "" }));
        if let Some(o) = &r.output {
            s.push_str(&format!("written:  {}\n", o.display()));
        }
        for h in &r.reports {
            s.push_str(&format!("report:   {}\n", h.display()));
        }
        let Some(t) = &r.profile.tuning else { return s };
        s.push_str(&format!(
            "tuned:    {} strategy, {:.1} s of {:.0} s budget, timing {}{}\n",
            t.strategy,
            t.used_s,
            t.budget_s,
            t.timing,
            if r.resumed_slots > 0 { format!(", {} slot races resumed from the cache", r.resumed_slots) } else { String::new() }
        ));
        s.push_str(&format!(
            "space:    {} valid variants, {} ruled out, {} complete combinations over {} fusion choices\n",
            t.space.variants,
            t.space.ruled_out.values().sum::<usize>(),
            t.space.combinations,
            t.space.fusion_choices
        ));
        s.push_str(&format!("limit:    {:.1} GB/s read ({})\n", t.limits.read_gbps, t.limits.read_source));
        if let Some(b) = &r.budget {
            let stages: Vec<String> = b.stages.iter().map(|x| format!("{} {:.1} s", x.stage, x.seconds)).collect();
            s.push_str(&format!("budget:   {:.1} s of {:.1} s: {}\n", b.used_s, b.budget_s, stages.join(", ")));
            for cut in &b.cuts {
                s.push_str(&format!("cut:      {cut}, to fit the budget\n"));
            }
        }
        s.push_str(&slot_table(t));
        s.push_str(&end_to_end(&t.end_to_end));
        s
    }
}

/// The slot races: each slot's chosen kernel with its timing and what it achieves.
fn slot_table(t: &crate::profile::doc::Tuning) -> String {
    #[derive(Tabled)]
    struct Row {
        slot: String,
        regime: String,
        chosen: String,
        #[tabled(rename = "median µs")]
        median: String,
        #[tabled(rename = "95% CI µs")]
        ci: String,
        #[tabled(rename = "GB/s")]
        gbps: String,
        #[tabled(rename = "% BW")]
        pct: String,
        #[tabled(rename = "GFLOP/s")]
        gflops: String,
        cands: String,
    }
    let rows = t.slots.iter().map(|x| {
        let c = x.candidates.iter().find(|c| c.variant.to_string() == x.chosen);
        Row {
            slot: x.slot.clone(),
            regime: x.regime.clone(),
            chosen: x.chosen.clone(),
            median: c.map(|c| format!("{:.1}", c.median_us)).unwrap_or_default(),
            ci: c.map(|c| format!("{:.1}–{:.1}", c.ci_us[0], c.ci_us[1])).unwrap_or_default(),
            gbps: c.map(|c| format!("{:.1}", c.gbps)).unwrap_or_default(),
            pct: c.map(|c| format!("{:.0}%", c.pct_of_bandwidth)).unwrap_or_default(),
            gflops: c.map(|c| format!("{:.1}", c.gflops)).unwrap_or_default(),
            cands: format!("{} timed, {} rejected", x.candidates.len(), x.rejected.len()),
        }
    });
    sharp_table(rows) + "\n"
}

/// The end-to-end combinations, the tuned and default figures, the head to head
/// and the decision with its reason, and the vision tower's request.
fn end_to_end(e: &crate::profile::doc::EndToEnd) -> String {
    let mut s = String::new();
    #[derive(Tabled)]
    struct E {
        combination: String,
        #[tabled(rename = "prefill tok/s")]
        prefill: String,
        #[tabled(rename = "decode tok/s")]
        decode: String,
        #[tabled(rename = "predicted ms")]
        predicted: String,
        chosen: String,
    }
    let es = e.combinations.iter().map(|c| E {
        combination: c.label.clone(),
        prefill: format!("{:.1}", c.result.prefill_tok_s),
        decode: format!("{:.2}", c.result.decode_tok_s),
        predicted: if c.predicted_ms > 0.0 { format!("{:.1}", c.predicted_ms) } else { "-".into() },
        chosen: if c.chosen { "✓".into() } else { String::new() },
    });
    s.push_str(&sharp_table(es));
    s.push('\n');
    s.push_str(&format!(
        "end to end ({} prompt tokens): tuned {:.1} prefill tok/s, {:.2} decode tok/s; runtime default {:.1} / {:.2} ({:+.1}% / {:+.1}%)\n",
        e.prefill_tokens,
        e.tuned.prefill_tok_s,
        e.tuned.decode_tok_s,
        e.default.prefill_tok_s,
        e.default.decode_tok_s,
        (e.tuned.prefill_tok_s / e.default.prefill_tok_s - 1.0) * 100.0,
        (e.tuned.decode_tok_s / e.default.decode_tok_s - 1.0) * 100.0
    ));
    if let Some(h) = &e.head_to_head {
        s.push_str(&format!(
            "head to head ({} rounds): `{}` {:.1} ms (95% CI {:.1}–{:.1}) a request, runtime default {:.1} ms ({:.1}–{:.1})\n",
            h.rounds, h.combination, h.tuned_ms, h.tuned_ci_ms[0], h.tuned_ci_ms[1], h.default_ms, h.default_ci_ms[0], h.default_ci_ms[1]
        ));
    }
    if let Some(d) = &e.decision {
        s.push_str(&format!("decision: {d}\n"));
    }
    if let Some(v) = &e.vision {
        // One request: prefill + decode_tokens × decode + one image, tuned
        // (the kept vision choice) against the runtime's default.
        let request = |t: &crate::profile::doc::Throughput, image_ms: f64| t.prefill_ms + e.decode_tokens as f64 * t.decode_ms + image_ms;
        let kept_ms = if v.kept { v.tuned_ms } else { v.default_ms };
        // Three decimals under a millisecond (a tiny tower's image), else one.
        let ms = |x: f64| if x < 1.0 { format!("{x:.3}") } else { format!("{x:.1}") };
        if v.rounds == 0 {
            // Not timed end to end (past the budget): the races' estimate.
            s.push_str(&format!(
                "end to end, one image per request ({}): about {} ms per image with the raced kernels; {}\n",
                v.image,
                ms(v.tuned_ms),
                v.reason
            ));
            return s;
        }
        s.push_str(&format!(
            "end to end, one image per request ({}): vision {} ms raced kernels, {} ms default per image ({}: {}); \
             request of {} + {} tokens + 1 image: tuned {:.1} ms, runtime default {:.1} ms\n",
            v.image,
            ms(v.tuned_ms),
            ms(v.default_ms),
            if v.kept { "raced kept" } else { "defaults kept" },
            v.reason,
            e.prefill_tokens,
            e.decode_tokens,
            request(&e.tuned, kept_ms),
            request(&e.default, v.default_ms)
        ));
    }
    s
}
