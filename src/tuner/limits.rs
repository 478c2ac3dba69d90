//! The memory bandwidth the slot measurements are compared against: measured once
//! per tune on the device itself (over a quarter of the memory under a short
//! budget, [`SHORT_BUDGET`], where the full measurement is a second or more of it).

use std::time::Instant;

use super::Target;
use crate::gpu::GpuCtx;
use crate::kernels;

/// Budgets under this measure the CPU's bandwidth over 64 MiB, three passes.
pub(crate) const SHORT_BUDGET: std::time::Duration = std::time::Duration::from_secs(30);

/// Read bandwidth of the target's device (GB/s) and how it was measured, within
/// a tune of `budget`.
pub(crate) fn measure(t: &Target<'_>, budget: std::time::Duration) -> (f64, &'static str) {
    if t.ctx.is_none() && budget < SHORT_BUDGET {
        return (cpu_read_bandwidth_over(16 << 20, 3), "measured: parallel read of 64 MiB in huge pages (a budget under 30 s)");
    }
    device_read_bandwidth(t.ctx.as_deref())
}

/// Read bandwidth (GB/s) of the CPU (`None`) or of a GPU, and how it was measured:
/// what `tune` records as `limits.read_gbps`, and what `bench` measures each round.
pub fn device_read_bandwidth(ctx: Option<&GpuCtx>) -> (f64, &'static str) {
    match ctx {
        None => (cpu_read_bandwidth(), "measured: parallel read of 256 MiB in huge pages"),
        Some(ctx) => (gpu_copy_bandwidth(ctx), "measured: copy kernel over 256 MiB (bytes read plus written per second)"),
    }
}

/// Read bandwidth of this CPU (both cores), GB/s: a parallel sum over 256 MiB,
/// backed by huge pages as the runtime's weights are.
pub fn cpu_read_bandwidth() -> f64 {
    cpu_read_bandwidth_over(64 << 20, 5)
}

/// [`cpu_read_bandwidth`] over `floats` f32s, the best of `passes`.
fn cpu_read_bandwidth_over(floats: usize, passes: usize) -> f64 {
    use rayon::prelude::*;
    let v: Vec<f32> = kernels::memory::huge_filled(floats, 1.0);
    kernels::memory::huge_pages(&v);
    let isa = kernels::cpu::Isa::best();
    let mut best = f64::INFINITY;
    for _ in 0..passes {
        let t = Instant::now();
        // The SIMD dot of each chunk with itself: every byte comes from memory once
        // (the second operand hits L1), at the widest vectors the CPU has.
        let s: f32 = v.par_chunks(1 << 14).map(|c| kernels::cpu::dot_f32(isa, c, c)).sum();
        std::hint::black_box(s);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (v.len() * 4) as f64 / best / 1e9
}

/// Memory bandwidth of a GPU, GB/s: the copy kernel of `bench-kernels` over
/// 256 MiB (past any L2), bytes read plus written per second, timed with timestamp
/// queries where the adapter has them. A wall-clock timing of one buffer copy
/// measured the submit's round trip instead (155 GB/s on an H200 whose copy
/// kernel moves 4.1 TB/s); 0 when the kernel cannot run.
fn gpu_copy_bandwidth(ctx: &GpuCtx) -> f64 {
    // the clocks of a sustained load, as the races see them (a failure shows in the copy)
    let _ = super::warm::settle(ctx);
    super::kbench::copy_bandwidth(ctx, 256 << 20).map_or(0.0, |(gbps, _)| gbps)
}
