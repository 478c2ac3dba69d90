//! `tune --budget` is a plan the tool accounts for: a short budget on the CPU
//! reports every stage's time from the command's start (the model's load
//! included), the stages add up to the time used, the profile records it, and
//! the report says what was cut to fit. Before the budget was planned, the races
//! ran every slot's first candidate and the end-to-end stage timed, scored and
//! confirmed every combination whatever was left: this tune (one layer of the
//! built-in SmolLM2-135M, synthetic weights) took 20.2 s of its 8 s on the
//! 2-core machine under a load of 11 (main's release binary); planned, 6.5 s
//! under the same load.
//!
//! Whether the wall time keeps within 10% of the budget is a measurement, not a
//! test: under the whole suite on two cores it measured 10.3 s of 8 s once and
//! failed a fresh clone's CI. `tools/bench_budget.sh` measures it (interleaved
//! rounds, median and spread of wall / budget); the plan's arithmetic (shares,
//! fits, a fixed cost past the budget) is `tuner::budget`'s unit test.

use crate::common::{ktune_in, tempdir};

#[test]
fn a_short_budget_accounts_for_its_stages_and_says_what_it_cut() {
    let tmp = tempdir();
    let out = tmp.path().join("tuned.yaml");
    let o = ktune_in(tmp.path())
        .args(["tune", "--device", "cpu", "--model", "smollm2-135m", "--layers", "1", "--budget", "8s"])
        .args(["--prefill-tokens", "16", "--context", "64", "--decode-tokens", "16", "--format", "json", "-o"])
        .arg(&out)
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON report");
    let b = &v["budget"];
    let (budget_s, used_s) = (b["budget_s"].as_f64().expect("budget_s"), b["used_s"].as_f64().expect("used_s"));
    assert_eq!(budget_s, 8.0);
    assert!(used_s > 0.0, "{b}");
    let stages = b["stages"].as_array().expect("stages");
    let names: Vec<&str> = stages.iter().map(|s| s["stage"].as_str().expect("stage")).collect();
    for want in ["loading the model", "device limits", "slot races", "end to end: timing", "writing the profile"] {
        assert!(names.contains(&want), "no stage `{want}`: {names:?}");
    }
    // The stages account for the time used (what is between them is bookkeeping).
    let sum: f64 = stages.iter().map(|s| s["seconds"].as_f64().expect("seconds")).sum();
    assert!(sum <= used_s + 1e-6 && sum >= 0.8 * used_s, "stages {sum} s of {used_s} s: {b}");
    // The profile records the same time used.
    let recorded = v["profile"]["tuning"]["used_s"].as_f64().expect("used_s");
    assert!(recorded <= used_s, "{recorded} > {used_s}");
    // What was cut agrees with the races: the slots the races' time left out (not
    // started: their variants "not reached within the budget: why") are the ones
    // the cut counts (none cut: every slot raced).
    let cuts: Vec<&str> = b["cuts"].as_array().expect("cuts").iter().map(|c| c.as_str().expect("text")).collect();
    assert!(cuts.iter().all(|c| c.contains(" of ") || c.contains("not run") || c.contains("instead of")), "{cuts:?}");
    let slots = v["profile"]["tuning"]["slots"].as_array().expect("slots");
    let unraced = slots
        .iter()
        .filter(|s| {
            let r = s["rejected"].as_array().cloned().unwrap_or_default();
            r.iter().any(|x| x["reason"].as_str().is_some_and(|w| w.starts_with("not reached within the budget: ")))
        })
        .count();
    let cut = cuts.iter().find(|c| c.starts_with("slot races: ") && c.contains("keep the runtime's default kernels"));
    match cut {
        Some(c) => assert!(c.contains(&format!("the other {unraced} slots")) && unraced > 0, "{c} vs {unraced} unraced slots"),
        None => assert_eq!(unraced, 0, "{cuts:?}"),
    }
    // Races that ran out of their time with candidates left (prepared or not,
    // never sampled: "not reached within the budget" alone) are said too: as
    // timing part of their candidates, or, started past the races' share, as
    // measuring their first alone; the first cut counts no more than there are.
    let partial = slots
        .iter()
        .filter(|s| {
            let r = s["rejected"].as_array().cloned().unwrap_or_default();
            r.iter().any(|x| x["reason"].as_str() == Some("not reached within the budget"))
        })
        .count();
    let part = cuts.iter().find(|c| c.starts_with("slot races: ") && c.contains("timed part of their candidates"));
    let first = cuts.iter().any(|c| c.starts_with("slot races: ") && c.contains("measured their first candidate alone"));
    if let Some(c) = part {
        let n: usize = c["slot races: ".len()..].split(' ').next().and_then(|n| n.parse().ok()).expect("a count");
        assert!(n >= 1 && n <= partial, "{c} vs {partial} races with candidates not reached");
    }
    assert!(partial == 0 || part.is_some() || first, "{partial} races left candidates unreached, no cut says so: {cuts:?}");
}

/// When one build of the whole model does not fit the end-to-end stage's share,
/// the stage times the model's first layers instead, says so as a cut, and the
/// profile records it (`tuning.end_to_end.timed_layers`): Llama 3.2 1B quantized to Q8_0 on
/// load takes seconds to build on two cores, past the share an 8 s budget leaves.
/// Before, the stage built the whole model whatever the budget (a 3B model's
/// 30 s tune took 46.5 s, its build ~20 s of it).
#[test]
fn a_build_past_the_budget_times_the_first_layers_and_says_so() {
    let tmp = tempdir();
    let o = ktune_in(tmp.path())
        .args(["tune", "--device", "cpu", "--model", "llama-3.2-1b", "--weight-dtype", "q8_0", "--budget", "8s"])
        .args(["--prefill-tokens", "16", "--context", "64", "--decode-tokens", "16", "--format", "json"])
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON report");
    // The time kept is the test above's and tools/bench_budget.sh's to show: this
    // one runs beside the whole suite on two cores, where a 1B model's single
    // LM-head race alone varies by seconds.
    let b = &v["budget"];
    let cuts: Vec<&str> = b["cuts"].as_array().expect("cuts").iter().filter_map(|c| c.as_str()).collect();
    let cut = cuts.iter().find(|c| c.starts_with("end to end: timed on the first ")).unwrap_or_else(|| panic!("no layer cut: {cuts:?}"));
    let layers = &v["profile"]["tuning"]["end_to_end"]["timed_layers"];
    let (timed, of) = (layers["timed"].as_u64().expect("timed"), layers["of"].as_u64().expect("of"));
    assert!(timed >= 1 && timed < of && of == 16, "{layers}");
    assert!(cut.contains(&format!("the first {timed} of {of} layers")), "{cut} vs {layers}");
}
