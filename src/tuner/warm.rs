//! The GPU warm-up every GPU timing starts with: the FMA-chain kernel
//! (`shaders/bench_fma.wgsl`) run until the adapter's clocks settle under a
//! sustained load ([`settle`]). The slot races (`measure::race`), the limits
//! (`limits.rs`) and `bench-kernels` (`kbench.rs`, whose FMA peak times the same
//! kernel) call it.

use std::time::{Duration, Instant};

use crate::gpu::builtin::BENCH_FMA as FMA;
use crate::gpu::{GpuCtx, GpuError, GpuProgram, grid_2d};

/// Workgroup size and chain length of the FMA kernel: `groups` workgroups do
/// `groups * FMA_WG * FMA_ITERS * 64` FLOPs.
pub(super) const FMA_WG: u32 = 256;
pub(super) const FMA_ITERS: u32 = 512;

/// One execution of the FMA-chain kernel over `groups` workgroups.
pub(super) fn fma_program(ctx: &GpuCtx, groups: u32) -> Result<GpuProgram, GpuError> {
    let coef: [f32; 12] = [1.0, 1.0, 1.0, 1.0, 0.999, 0.999, 0.999, 0.999, 1e-3, 1e-3, 1e-3, 1e-3];
    let coef = ctx.upload("bench fma coef", bytemuck::cast_slice(&coef));
    let pipe = ctx.pipeline(&FMA, "fma_chain", &[("WG", FMA_WG as f64), ("ITERS", FMA_ITERS as f64)])?;
    let out = ctx.storage("bench fma out", groups as u64 * FMA_WG as u64 * 16);
    let step = ctx.step("bench fma", pipe, &[&coef, &out], grid_2d(groups))?;
    Ok(GpuProgram { steps: vec![step], owned: vec![coef, out] })
}

/// What [`warm_up`] saw: how long it kept the GPU busy, the FMA kernel's rate in
/// its first and last timed batches (equal batches, so a rise between them is the
/// clocks'), and whether the rate settled before the time ran out.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct WarmUp {
    pub ms: f64,
    pub first_gflops: f64,
    pub last_gflops: f64,
    pub settled: bool,
    /// Whether it ran until the rate settled (false: a fixed time, `min` = `max`,
    /// as on a software adapter).
    pub until_settled: bool,
}

/// Relative change of the FMA rate between two batches under which the clocks
/// count as settled.
const SETTLED: f64 = 0.03;
/// A batch is timed once it takes at least this long (shorter ones are doubled:
/// their rate is the submit's, not the clocks').
const WARM_BATCH_S: f64 = 0.005;

/// Keeps the GPU busy with the FMA kernel (at least `min`, wall clock) until its
/// rate settles, two batches in a row within 3%, or `max` has passed, so that the
/// timings that follow see the clocks of a sustained load: an idle GPU runs slow
/// clocks (an H200 idles at 345 MHz SM) and raises them only under load, and a
/// race's first samples would otherwise time it on the way up (first seen on an
/// H200: the same GEMV timed 11 µs after a minute of parity checks and 52 µs as
/// the first work of a fresh machine; its FMA peak read 46.9 TFLOP/s in three
/// calls and 65.1 in one). At least one batch runs whatever `max` is.
pub fn warm_up(ctx: &GpuCtx, min: Duration, max: Duration) -> Result<WarmUp, GpuError> {
    const GROUPS: u32 = 256;
    let prog = fma_program(ctx, GROUPS)?;
    let flops = GROUPS as f64 * FMA_WG as f64 * FMA_ITERS as f64 * 64.0;
    let t0 = Instant::now();
    let mut batch = 1usize;
    let (mut first, mut prev) = (None, None::<f64>);
    loop {
        let all: Vec<&GpuProgram> = (0..batch).map(|_| &prog).collect();
        let t = Instant::now();
        ctx.run("warm-up", &all)?;
        let dt = t.elapsed().as_secs_f64();
        let rate = batch as f64 * flops / dt.max(1e-9) / 1e9;
        let done = t0.elapsed() >= max;
        if dt < WARM_BATCH_S && batch < 256 && !done {
            batch *= 2;
            continue;
        }
        let first = *first.get_or_insert(rate);
        let settled = prev.is_some_and(|p| (rate - p).abs() <= SETTLED * rate) && t0.elapsed() >= min;
        if settled || done {
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            return Ok(WarmUp { ms, first_gflops: first, last_gflops: rate, settled, until_settled: max > min });
        }
        prev = Some(rate);
    }
}

/// Sustained load before GPU timings ([`warm_up`]): at least 60 ms, and on a
/// hardware GPU up to 1 s until the FMA rate settles (a software adapter's clocks
/// are the host CPU's: the minimum only). Before each race of the tuner and
/// `bench-kernels`, and before the limits are measured.
pub fn settle(ctx: &GpuCtx) -> Result<WarmUp, GpuError> {
    let min = Duration::from_millis(60);
    warm_up(ctx, min, if ctx.caps.software { min } else { Duration::from_secs(1) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The warm-up times at least one batch, and with no time left stops there,
    /// not settled (nothing to compare with); with time, it stops at `max` at the
    /// latest (plus the batch under way).
    #[test]
    fn warm_up_stops_within_its_bounds() {
        let Some(gpu) = crate::testing::test_gpu() else { return };
        let w = warm_up(&gpu, Duration::ZERO, Duration::ZERO).expect("warms up");
        assert!(!w.settled && w.first_gflops > 0.0 && w.first_gflops == w.last_gflops, "{w:?}");
        let w = warm_up(&gpu, Duration::from_millis(20), Duration::from_millis(400)).expect("warms up");
        assert!(w.ms >= 20.0 && w.last_gflops > 0.0, "{w:?}");
        let batch_ms = 256.0 * 256.0 * 256.0 * FMA_ITERS as f64 * 64.0 / (w.last_gflops.min(w.first_gflops) * 1e6);
        assert!(w.ms <= 400.0 + 2.0 * batch_ms, "{w:?}");
    }
}
