//! GPU times from timestamps (`runtime/gpu.rs`: `StepTiming`, the token stamps)
//! on the test GPU (lavapipe in CI; skipped loudly without one): a profiled
//! decode step timed inside its passes has every slot of its schedule, each time
//! at least 0 and together at most the step's own GPU span (a prefill pass too
//! has every slot), and asks the device
//! for exactly the passes, dispatches and submits an unprofiled step does; the
//! fallback (a pass per step, forced) still gives the breakdown, with more
//! passes, and the chained steps after it their GPU time per token.

use std::collections::BTreeSet;

use crate::chain::{engine, prefill};
use crate::common::fixture;
use ktune::gpu::GpuCounts;
use ktune::kernels::sample::{Sampler, SamplerParams};
use ktune::plan::Slot;
use ktune::runtime::{Engine, StepTiming};
use ktune::testing::test_gpu;

/// The slots of the engine's schedule for a pass of `tokens` at its position.
fn slots(e: &Engine, tokens: usize) -> BTreeSet<Slot> {
    e.plan.steps(tokens, e.pos).expect("steps").iter().map(|s| s.slot).collect()
}

/// One decode step (a chain of one) from `token`, profiled when asked: its next
/// id and what the device's context did for it.
fn step(e: &mut Engine, token: u32, profile: bool, counts: impl Fn() -> GpuCounts) -> (u32, GpuCounts) {
    if profile {
        e.profile_next();
    }
    let mut s = Sampler::new(SamplerParams::GREEDY);
    let mut next = 0;
    let before = counts();
    e.decode_chain(token, 1, 1, &mut s, |id| {
        next = id;
        true
    })
    .expect("decode step");
    (next, counts().since(&before))
}

#[test]
fn a_step_profiled_inside_its_passes_runs_the_unprofiled_command_stream() {
    let Some(gpu) = test_gpu() else { return };
    assert!(gpu.caps.timestamp_query, "the test GPU writes timestamps");
    if !gpu.caps.timestamp_inside_passes {
        eprintln!("SKIPPED: {} writes no timestamps inside passes", gpu.name);
        return;
    }
    let counts = || gpu.counters.snapshot();
    let (mut e, prompt) = engine(&fixture("llama3-tiny"), Some(&gpu), None);
    assert_eq!(e.step_timing(), Some(StepTiming::InsidePass));
    // The prefill profiled the same way: its copy of the last row between two
    // passes timed too (every resolved query written).
    let want = slots(&e, prompt.len());
    e.profile_next();
    let first = prefill(&mut e, &prompt, &mut Sampler::new(SamplerParams::GREEDY));
    assert_eq!(e.prefill_times.seconds.keys().copied().collect::<BTreeSet<_>>(), want, "every prefill slot timed");
    // The first step compiles the schedule; then an unprofiled step and a profiled one.
    let (t, _) = step(&mut e, first, false, counts);
    let (t, plain) = step(&mut e, t, false, counts);
    e.decode_times.seconds.clear();
    let (_, profiled) = step(&mut e, t, true, counts);
    assert_eq!(
        (profiled.passes, profiled.dispatches, profiled.submits),
        (plain.passes, plain.dispatches, plain.submits),
        "the same passes, dispatches and submits"
    );
    assert_eq!(profiled.query_sets, 1, "the step's query set: {profiled:?}");
    let times = &e.decode_times.seconds;
    assert_eq!(times.keys().copied().collect::<BTreeSet<_>>(), slots(&e, 1), "every slot of the schedule timed");
    assert!(times.values().all(|&s| s >= 0.0), "{times:?}");
    let span = e.profiled_step_gpu_seconds.expect("the profiled step's own GPU span");
    let sum = e.decode_times.total();
    assert!(sum > 0.0 && span > 0.0, "{sum} s in slots, {span} s the step");
    // The slots' spans lie inside the step's (timer rounding aside).
    assert!(sum <= span * 1.05 + 1e-6, "the slots ({sum} s) within the step ({span} s)");
}

#[test]
fn the_pass_per_step_fallback_gives_the_breakdown_and_the_time_per_token() {
    let Some(gpu) = test_gpu() else { return };
    let counts = || gpu.counters.snapshot();
    let (mut e, prompt) = engine(&fixture("llama3-tiny"), Some(&gpu), None);
    e.set_pass_per_step(true);
    assert_eq!(e.step_timing(), Some(StepTiming::PassPerStep), "forced, whatever the adapter can do");
    let first = prefill(&mut e, &prompt, &mut Sampler::new(SamplerParams::GREEDY));
    let (t, _) = step(&mut e, first, false, counts);
    let (t, plain) = step(&mut e, t, false, counts);
    e.decode_times.seconds.clear();
    let (t, profiled) = step(&mut e, t, true, counts);
    assert!(profiled.passes > plain.passes, "a pass per step: {profiled:?} against {plain:?}");
    assert_eq!(profiled.dispatches, plain.dispatches - 1, "the same kernels, without the token stamps' sum");
    let times = &e.decode_times.seconds;
    assert_eq!(times.keys().copied().collect::<BTreeSet<_>>(), slots(&e, 1), "every slot of the schedule timed");
    assert!(times.values().all(|&s| s >= 0.0) && e.decode_times.total() > 0.0, "{times:?}");
    assert_eq!(e.profiled_step_gpu_seconds, None, "no span for a step timed a pass per step");
    // Chained steps after it: each one's GPU time, per token.
    let mut s = Sampler::new(SamplerParams::GREEDY);
    e.decode_chain(t, 8, 4, &mut s, |_| true).expect("chains");
    let c = e.decode_counters().expect("tallied tokens");
    let ms = c.gpu_ms.expect("GPU time per token");
    assert!(ms > 0.0, "{c:?}");
}
