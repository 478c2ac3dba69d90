//! `ktune bench-kernels`: on a GPU adapter, every WGSL family's best variant at
//! the shapes of built-in models (Gemma 3 1B and Llama 3.2 1B by default), with
//! the GB/s and GFLOP/s it reaches against the adapter's copy bandwidth and FMA
//! peak, both measured in the same run ([`crate::tuner::kbench`]).

use std::time::Instant;

use crate::cli::BenchKernelsArgs;
use crate::device::Device;
use crate::kernels::{Op, variant_label};
use crate::profile::doc::Measurement;
use crate::progress::Progress;
use crate::report::{KernelBenchReport, KernelBenchRow, VariantTime};
use crate::session;
use crate::tuner::kbench::{self, RaceOptions};
use crate::tuner::measure::Rotation;
use crate::{Error, Result};

/// Bytes the copy kernel moves each way: past any current GPU's L2.
const COPY_BYTES: u64 = 256 << 20;

/// Measures the limits, then every entry; `progress` sees one step per entry.
pub fn run(selector: Option<&str>, args: &BenchKernelsArgs, progress: &dyn Progress) -> Result<KernelBenchReport> {
    // Flags first, before anything heavy.
    let mut ops = Vec::new();
    for name in &args.op {
        match Op::ALL.iter().find(|o| o.name() == name) {
            Some(o) => ops.push(*o),
            None => {
                let all: Vec<_> = Op::ALL.iter().map(|o| o.name()).collect();
                return Err(Error::Usage(format!("--op `{name}`: unknown op; ops: {}", all.join(", "))));
            }
        }
    }
    let mut only: Vec<&'static str> = Vec::new();
    for id in &args.kernel {
        match crate::kernels::find(id) {
            Ok(k) if k.backend() == crate::kernels::Backend::Wgsl => only.push(k.id),
            Ok(_) => return Err(Error::Usage(format!("--kernel `{id}` is a CPU kernel; bench-kernels races WGSL kernels"))),
            Err(e) => return Err(Error::Usage(format!("--kernel: {e}"))),
        }
    }
    let configs =
        args.models.iter().map(|m| crate::model::builtin(m).map(|c| (m.clone(), c))).collect::<std::result::Result<Vec<_>, _>>()?;
    if configs.is_empty() {
        return Err(Error::Usage("--models: give at least one built-in model".into()));
    }
    let tokens = args.prefill_tokens.unwrap_or(if args.quick { 32 } else { 128 });
    let context = args.context.unwrap_or(if args.quick { 256 } else { 1024 });
    if tokens == 0 || context == 0 {
        return Err(Error::Usage("--prefill-tokens and --context must be positive".into()));
    }
    let device = session::pick_device(selector)?;
    if matches!(device, Device::Cpu(_)) {
        return Err(Error::Usage(
            "bench-kernels measures WGSL kernels and needs a GPU adapter (`ktune list-devices`; lavapipe serves): pick one with --device"
                .into(),
        ));
    }
    // The shapes' sizes, as run and tune check them: within each model and the adapter.
    for (_, c) in &configs {
        session::check_context(c, context, crate::kernels::DType::F32, &device, "--context")?;
        session::check_context(c, tokens, crate::kernels::DType::F32, &device, "--prefill-tokens")?;
    }
    let rotation = Rotation::for_device(&device, args.gpu_l2_bytes);
    let ctx = session::open_device(&device, args.trusted_shaders)?
        .ok_or_else(|| Error::Usage("the device opened without a GPU context".into()))?;

    let mut entries: Vec<kbench::Entry> = configs.iter().flat_map(|(m, c)| kbench::entries(m, c, tokens, context)).collect();
    if !ops.is_empty() {
        entries.retain(|e| ops.contains(&e.problem.op()));
    }
    if !only.is_empty() {
        entries.retain(|e| only.iter().any(|id| crate::kernels::find(id).is_ok_and(|k| k.op == e.problem.op())));
    }
    if entries.is_empty() {
        return Err(Error::Usage("no shape of these models is of the ops given with --op / --kernel".into()));
    }

    progress.phase("limits", 0);
    let warm_up = crate::tuner::warm::settle(&ctx)?;
    let limits = kbench::peaks(&ctx, COPY_BYTES)?;
    let start = Instant::now();
    let opts = RaceOptions { quick: args.quick, rotation: rotation.clone(), seed: args.seed, only };
    progress.phase("", entries.len() as u64);
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    let mut errors = Vec::new();
    let mut timestamps = false;
    for (i, e) in entries.iter().enumerate() {
        progress.step(&format!("{} {} {}", e.model, e.what, e.dtype));
        let left = args.budget.saturating_sub(start.elapsed());
        let deadline = Instant::now() + kbench::share(left, entries.len() - i);
        let b = match kbench::best_variant(&ctx, e, &opts, deadline) {
            Ok(Some(b)) => b,
            Ok(None) => {
                skipped.push(format!("{}: {} {} ({})", e.model, e.what, e.dtype, e.problem.describe()));
                progress.tick();
                continue;
            }
            Err(why) => {
                errors.push(format!("{}: {} {} ({}): {why}", e.model, e.what, e.dtype, e.problem.describe()));
                progress.tick();
                continue;
            }
        };
        timestamps |= b.timestamps;
        let gbps = e.problem.min_bytes(e.dtype) / b.median_s / 1e9;
        let gflops = e.problem.flops() / b.median_s / 1e9;
        rows.push(KernelBenchRow {
            model: e.model.clone(),
            what: e.what.into(),
            op: e.problem.op().name().into(),
            problem: e.problem.describe(),
            dtype: e.dtype,
            kernel: variant_label(b.kernel.id, &b.params),
            candidates: b.candidates,
            copies: b.copies,
            median_us: b.median_s * 1e6,
            gbps,
            gflops,
            pct_of_bandwidth: gbps / limits.copy_gbps * 100.0,
            pct_of_peak_flops: gflops / limits.fma_gflops * 100.0,
            check: b.failed_check.map_or_else(|| "passed".to_string(), |why| format!("failed: {why}")),
            variants: b
                .all
                .iter()
                .map(|(kernel, s)| VariantTime { kernel: kernel.clone(), median_us: s * 1e6, gbps: e.problem.min_bytes(e.dtype) / s / 1e9 })
                .collect(),
        });
        progress.tick();
    }
    progress.done();
    let max_copies = rows.iter().map(|r| r.copies).max().unwrap_or(1);
    Ok(KernelBenchReport {
        device: device.name(),
        backend: device.backend_name(),
        timing: if timestamps { "gpu-timestamps" } else { "wall-clock" }.into(),
        trusted_shaders: ctx.trusted_shaders(),
        measurement: Measurement {
            method: Rotation::METHOD.into(),
            cache_bytes: rotation.cache_bytes,
            cache_source: rotation.cache_source,
            rotate_bytes: rotation.rotate_bytes,
            max_copies,
        },
        warm_up,
        limits,
        quick: args.quick,
        prefill_tokens: tokens,
        context,
        rows,
        skipped,
        errors,
    })
}
