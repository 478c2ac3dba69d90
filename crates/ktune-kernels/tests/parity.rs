//! Parity of every kernel variant against the f64 CPU reference: every CPU kernel on
//! the CPU, every WGSL kernel on the test GPU (lavapipe in CI; see
//! `ktune_kernels::testing::test_gpu` for when a missing adapter skips and when it fails).
//!
//! A libtest-mimic harness: one trial per kernel and backend (`cpu/<id>`,
//! `wgsl/<id>`), so a failure names its kernel and `cargo test --test parity -- wgsl/gemv_wg`
//! runs one, and one trial per cross-kernel property below. The harness prints how
//! many checks ran in all, the figure to compare when the suite changes.

use std::sync::atomic::{AtomicUsize, Ordering};

use ktune_kernels::device::CpuCaps;
use ktune_kernels::kernels::verify::{self, Runner};
use ktune_kernels::kernels::{self, Backend, Caps};
use ktune_kernels::testing::test_gpu;
use libtest_mimic::{Arguments, Failed, Trial};

/// The matrix-unit GEMMs (`*_coop8/16`) run only where the adapter reports their
/// matrix shape; elsewhere they must run no check and say why (no cooperative
/// matrices, or a generic limit checked first: on lavapipe the workgroup memory).
/// Their tiling runs everywhere as the `*_mma_emu` variants. Returns whether `k`
/// was such a refusal (its verdict then holds nothing to report).
fn coop_refused(k: &kernels::KernelDef, gpu: &ktune_kernels::gpu::GpuCtx, v: &verify::KernelVerdict) -> bool {
    if !k.id.contains("_coop") || !gpu.caps.coop_matrix.is_empty() {
        return false;
    }
    let reason = v.not_run.clone().unwrap_or_default();
    assert!(
        v.checks == 0 && (reason.contains("cooperative matri") || reason.contains("workgroup memory")),
        "{} on {}: {} checks, {reason}",
        k.id,
        gpu.name,
        v.checks
    );
    true
}

fn report(verdicts: &[verify::KernelVerdict]) -> String {
    let mut s = String::new();
    for v in verdicts {
        for f in &v.failures {
            s.push_str(&format!(
                "{} {} {:?} on {}: rel err {:.3e} (tol {:.1e}) {}\n",
                f.kernel,
                f.dtype,
                f.params,
                f.problem,
                f.rel_err,
                f.tolerance,
                f.error.as_deref().unwrap_or("")
            ));
        }
    }
    s
}

/// Checks run by every trial together.
static CHECKS: AtomicUsize = AtomicUsize::new(0);

fn counted(n: usize) {
    CHECKS.fetch_add(n, Ordering::Relaxed);
}

/// Each trial's name, seconds, and the GPU pipelines built meanwhile with the CPU
/// seconds building them took (exact only with `--test-threads 1`): the slowest
/// are printed at the end, the figures to look at when the suite grows slow.
static TIMES: std::sync::Mutex<Vec<(String, f64, u64, f64)>> = std::sync::Mutex::new(Vec::new());

/// `f` as a trial named `name`, timed into [`TIMES`].
fn timed(name: String, f: impl FnOnce() -> Result<(), Failed> + Send + 'static) -> Trial {
    Trial::test(name.clone(), move || {
        let built = || test_gpu().map_or((0, 0.0), |g| (g.pipeline_stats.get().0, g.pipeline_stats.get().2));
        let (start, before) = (std::time::Instant::now(), built());
        let r = f();
        let after = built();
        let secs = start.elapsed().as_secs_f64();
        TIMES.lock().unwrap_or_else(|e| e.into_inner()).push((name, secs, after.0 - before.0, after.1 - before.1));
        r
    })
}

/// A property test as a trial: its panic is the failure.
fn property(name: &str, f: fn()) -> Trial {
    timed(name.to_string(), move || {
        f();
        Ok(())
    })
}

/// One kernel on the CPU: every parameter value of its sweep on every test shape
/// of each storage type it takes (block formats against the dequantized reference).
fn cpu_kernel(k: &'static kernels::KernelDef) -> Result<(), Failed> {
    let caps = CpuCaps::detect();
    let v = verify::verify_kernel(&Runner::Cpu, Caps::Cpu(&caps), k, verify::Sweep::Axes);
    if v.checks == 0 {
        return Err(format!("{} ran no check: {:?}", k.id, v.not_run).into());
    }
    counted(v.checks);
    let failed = report(std::slice::from_ref(&v));
    if failed.is_empty() { Ok(()) } else { Err(format!("CPU parity failures:\n{failed}").into()) }
}

/// One kernel on the test GPU, the sweep's parameter sets rotating over its
/// storage types and test problems (`Sweep::AxesRotating`: on a software
/// adapter each check is a compile or a dispatch the CPU runs, most of the
/// suite's time). A matrix-unit kernel on an adapter without matrix
/// units must refuse and say why; a float kernel may find no valid shape there
/// (its `*_mma_emu` tiling must not), a block-format one must run checks.
fn wgsl_kernel(k: &'static kernels::KernelDef) -> Result<(), Failed> {
    let Some(gpu) = test_gpu() else { return Ok(()) };
    let v = verify::verify_kernel(&Runner::Gpu(&gpu), Caps::Gpu(&gpu.caps), k, verify::Sweep::AxesRotating);
    if coop_refused(k, &gpu, &v) {
        return Ok(());
    }
    let quant = k.dtypes.iter().any(|d| d.is_quant());
    if v.checks == 0 && (quant || k.id.contains("_mma_emu")) {
        return Err(format!("{} ran no check on {}: {:?}", k.id, gpu.name, v.not_run).into());
    }
    counted(v.checks);
    let failed = report(std::slice::from_ref(&v));
    if failed.is_empty() { Ok(()) } else { Err(format!("WGSL parity failures on {}:\n{failed}", gpu.name).into()) }
}

fn main() {
    let args = Arguments::from_args();
    // Opened once, before the trials: a missing adapter skips (loudly) or fails here.
    let gpu = test_gpu().is_some();
    // The trials run side by side, each thread between its kernel calls in the
    // f64 reference or in lavapipe: a pool worker spinning for its next job
    // (2 ms after each, the decode loop's setting) takes CPU the other trial
    // could use. Parked at once, the suite ran 1.5-2.3% faster in each of three
    // interleaved pairs with Mesa's shader cache warm (106-108 against 108-110 s
    // on a 2-core Xeon); cold, lavapipe's compiles hide it.
    ktune_kernels::kernels::cpu::pool::pool().set_spin(std::time::Duration::ZERO);
    // Longest first, so that the short ones fill the threads at the end: the WGSL
    // trials (on lavapipe mostly compiling), the properties, then the CPU trials.
    let mut trials: Vec<Trial> = Vec::new();
    let mut cpu_trials: Vec<Trial> = Vec::new();
    for k in kernels::registry() {
        match k.backend() {
            Backend::Cpu => cpu_trials.push(timed(format!("cpu/{}", k.id), move || cpu_kernel(k))),
            _ => trials.push(timed(format!("wgsl/{}", k.id), move || wgsl_kernel(k)).with_ignored_flag(!gpu)),
        }
    }
    trials.extend([
        property("every_op_has_two_wgsl_and_two_cpu_kernels_with_parameters", every_op_has_two_wgsl_and_two_cpu_kernels_with_parameters),
        property("every_quantized_op_has_both_backends_for_every_format", every_quantized_op_has_both_backends_for_every_format),
        property("preferred_kernels_exist_and_compute_their_op", preferred_kernels_exist_and_compute_their_op),
        property("trusted_wgsl_kernels_match_reference_one_per_family", trusted_wgsl_kernels_match_reference_one_per_family),
        property("repacked_k_quant_weights_give_the_row_layout_results", repacked_k_quant_weights_give_the_row_layout_results),
        property(
            "repacked_q4_0_q8_0_iq4_nl_weights_give_the_row_layout_results",
            repacked_q4_0_q8_0_iq4_nl_weights_give_the_row_layout_results,
        ),
        property("every_kernel_and_storage_type_has_a_test_shape", every_kernel_and_storage_type_has_a_test_shape),
        property("residual_layer_norm_is_residual_add_then_layer_norm", residual_layer_norm_is_residual_add_then_layer_norm),
        property("two_stage_matrix_tilings_match_reference", two_stage_matrix_tilings_match_reference),
    ]);
    trials.extend(cpu_trials);
    let conclusion = libtest_mimic::run(&args, trials);
    if !args.list {
        println!("parity: {} checks in all", CHECKS.load(Ordering::Relaxed));
        let gpus = ktune_kernels::testing::test_gpus();
        if let Some(gpu) = gpus.first() {
            let (built, wall, cpu) =
                gpus.iter().map(|g| g.pipeline_stats.get()).fold((0, 0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2));
            println!("parity: {built} GPU pipelines built on {} ({} devices) in {wall:.1} s ({cpu:.1} s of CPU)", gpu.name, gpus.len());
        }
        let mut times = TIMES.lock().unwrap_or_else(|e| e.into_inner()).clone();
        times.sort_by(|a, b| b.1.total_cmp(&a.1));
        // Against the run's wall time: how well the trials filled the test threads.
        println!("parity: {} trials, {:.1} s of trial time in all", times.len(), times.iter().map(|t| t.1).sum::<f64>());
        for (name, secs, built, cpu) in times.iter().take(12) {
            println!("parity: {secs:7.1} s {built:5} pipelines ({cpu:6.1} s of CPU)  {name}");
        }
    }
    conclusion.exit();
}

/// Issue requirement: every op has at least two WGSL and two CPU kernels, and each
/// kernel declares tunable parameters. An op of `Op::CPU_ONLY` (none now: the
/// vision ops have their WGSL kernels) has CPU kernels only (and none of WGSL, so
/// the list cannot go stale).
fn every_op_has_two_wgsl_and_two_cpu_kernels_with_parameters() {
    use ktune_kernels::kernels::{Op, for_op};
    // The fused decode op whose alternative is the unfused steps the plan falls
    // back to (the tuner races `fused.qkv_rope_cache` on and off): one kernel a
    // backend for now, a second (a subgroup reduction) still to build. Listed
    // here so that the exception is seen and the list cannot grow unnoticed.
    const ONE_KERNEL: [Op; 1] = [Op::QkvRopeCache];
    for op in Op::ALL {
        let wgsl = for_op(op).filter(|k| k.backend() == Backend::Wgsl).count();
        let cpu = for_op(op).filter(|k| k.backend() == Backend::Cpu).count();
        let want = if ONE_KERNEL.contains(&op) { 1 } else { 2 };
        let want_wgsl = if op.has_wgsl() { want } else { 0 };
        assert!(wgsl >= want_wgsl && cpu >= want, "{op}: {wgsl} WGSL and {cpu} CPU kernels");
        assert!(op.has_wgsl() || wgsl == 0, "{op} has WGSL kernels now: take it out of Op::CPU_ONLY");
        for k in for_op(op) {
            assert!(!k.params.is_empty(), "{} has no tunable parameter", k.id);
        }
    }
}

/// Every format of every quantized op has both backends (the kernels' parity is
/// their own trials, `cpu/<id>` and `wgsl/<id>`, against the f64 reference over
/// the dequantized weights).
fn every_quantized_op_has_both_backends_for_every_format() {
    use ktune_kernels::kernels::{DType, Op, for_op};
    for op in [Op::Gemv, Op::Gemm, Op::GateUp, Op::QkvProj, Op::NormGemv] {
        for d in DType::QUANT {
            for b in [Backend::Cpu, Backend::Wgsl] {
                assert!(for_op(op).any(|k| k.backend() == b && k.dtypes.contains(d)), "{op}: no {} kernel for {d}", b.name());
            }
        }
    }
}

/// The runtime's preference lists (`kernels::preferred`) name kernels that
/// exist and compute the op of the problem on that backend: the runtime skips an id
/// it cannot find, so a typo there would silently change the defaults.
fn preferred_kernels_exist_and_compute_their_op() {
    use ktune_kernels::kernels::preferred::preferred;
    use ktune_kernels::kernels::problem::test_problems;
    use ktune_kernels::kernels::{Op, registry};
    let mut named = 0;
    for op in Op::ALL {
        for problem in test_problems(op) {
            for backend in [Backend::Cpu, Backend::Wgsl] {
                for id in preferred(&problem, backend) {
                    let k = registry().iter().find(|k| k.id == *id).unwrap_or_else(|| {
                        panic!("the {} preference list for {op} names `{id}`, which is not in the registry", backend.name())
                    });
                    assert_eq!(k.op, op, "the {} preference list for {op} names `{id}`, which computes {}", backend.name(), k.op);
                    assert_eq!(
                        k.backend(),
                        backend,
                        "the {} preference list for {op} names `{id}`, a {} kernel",
                        backend.name(),
                        k.backend().name()
                    );
                    named += 1;
                }
            }
        }
    }
    assert!(named > 0, "no preference list was reached");
}

/// Trusted shader modules (`create_shader_module_trusted` without runtime bounds
/// checks, `--trusted-shaders`) compute what the checked ones do: per op, its first
/// float WGSL kernel and its first block-format one, with default parameters, on
/// two test shapes of each dtype they accept, against the f64 reference. Pipelines of
/// the two kinds are cached apart (the cache key holds the kind).
fn trusted_wgsl_kernels_match_reference_one_per_family() {
    use ktune_kernels::kernels::Op;
    use ktune_kernels::kernels::problem::test_problems;
    use ktune_kernels::kernels::verify::{GpuBuffers, check_one, make_inputs};
    let Some(gpu) = test_gpu() else { return };
    let trusted = gpu.with_trusted_shaders(true);
    assert!(trusted.trusted_shaders() && !gpu.trusted_shaders());
    let caps = Caps::Gpu(&gpu.caps);
    let mut failures = String::new();
    let mut families = 0;
    let mut quant_families = 0;
    for op in Op::ALL.into_iter().filter(|op| op.has_wgsl()) {
        let wgsl: Vec<_> = kernels::for_op(op).filter(|k| k.backend() == Backend::Wgsl).collect();
        // the first float and the first block-format kernel this adapter runs (the
        // matrix-unit GEMMs need matrix shapes a software adapter does not report)
        let runs = |k: &&&kernels::KernelDef| {
            k.dtypes.iter().any(|&d| test_problems(op).iter().any(|p| k.check(caps, p, d, &k.default_params()).is_ok()))
        };
        let float = wgsl.iter().filter(|k| !k.dtypes.iter().any(|d| d.is_quant())).find(runs);
        let quant = wgsl.iter().filter(|k| k.dtypes.iter().any(|d| d.is_quant())).find(runs);
        let mut ran_op = 0;
        for k in float.into_iter().chain(quant) {
            let params = k.default_params();
            let mut ran = 0;
            for &dtype in k.dtypes {
                let accepted = test_problems(op).into_iter().filter(|p| k.check(caps, p, dtype, &params).is_ok());
                // Two shapes per dtype: a representative check, not the full sweep.
                for (qi, p) in accepted.take(2).enumerate() {
                    let p = &p;
                    let c = check_one(&Runner::Gpu(&trusted), k, p, dtype, &params, 0x7a57 ^ qi as u64);
                    ran += 1;
                    if !c.passed {
                        failures.push_str(&format!("{} {dtype} on {}: rel err {:.3e} {:?}\n", k.id, c.problem, c.rel_err, c.error));
                    }
                }
            }
            assert!(ran > 0, "{} ran no trusted check on {}", k.id, gpu.name);
            if k.dtypes.iter().any(|d| d.is_quant()) {
                quant_families += 1;
            }
            ran_op += ran;
        }
        assert!(ran_op > 0, "{op}: no WGSL kernel checked trusted");
        counted(ran_op);
        families += 1;
    }
    assert_eq!(families, Op::ALL.len() - Op::CPU_ONLY.len());
    assert!(quant_families >= 3, "only {quant_families} block-format families checked");
    assert!(failures.is_empty(), "trusted WGSL parity failures on {}:\n{failures}", gpu.name);

    // The pipeline cache keeps the two kinds apart, and reuses each.
    let k = kernels::for_op(Op::Gemv).find(|k| k.backend() == Backend::Wgsl).expect("a WGSL GEMV");
    let p = test_problems(Op::Gemv).into_iter().find(|p| k.check(caps, p, k.dtypes[0], &k.default_params()).is_ok()).expect("a shape");
    let d = k.dtypes[0];
    let bufs = GpuBuffers::new(&gpu, &p, d, &make_inputs(&p, d, 1));
    let prog = |g: &ktune_kernels::gpu::GpuCtx| k.prepare_wgsl(g, &p, d, &k.default_params(), &bufs.refs(), None).expect("prepares");
    let (a, b, c) = (prog(&gpu), prog(&trusted), prog(&trusted));
    assert!(!std::sync::Arc::ptr_eq(&a.steps[0].pipeline, &b.steps[0].pipeline), "trusted and checked share a pipeline");
    assert!(std::sync::Arc::ptr_eq(&b.steps[0].pipeline, &c.steps[0].pipeline), "the trusted pipeline is not cached");

    // Two shaders of one file that prepend different heads or append different
    // includes are two modules.
    static PLAIN: ktune_kernels::gpu::Shader = ktune_kernels::gpu::Shader {
        name: "cache_probe.wgsl",
        source: "@group(0) @binding(0) var<storage, read_write> o: array<u32>;\n@compute @workgroup_size(1) fn main() { o[0] = 1u; }\n",
        heads: &[],
        includes: &[],
    };
    static WITH_INCLUDE: ktune_kernels::gpu::Shader = ktune_kernels::gpu::Shader {
        name: "cache_probe.wgsl",
        source: "@group(0) @binding(0) var<storage, read_write> o: array<u32>;\n@compute @workgroup_size(1) fn main() { o[0] = two(); }\nfn two() -> u32 { return 2u; }\n",
        heads: &[],
        includes: &["two.wgsl"],
    };
    static WITH_HEAD: ktune_kernels::gpu::Shader = ktune_kernels::gpu::Shader {
        name: "cache_probe.wgsl",
        source: "const THREE: u32 = 3u;\n@group(0) @binding(0) var<storage, read_write> o: array<u32>;\n@compute @workgroup_size(1) fn main() { o[0] = THREE; }\n",
        heads: &["three.wgsl"],
        includes: &[],
    };
    let (p1, p2) = (gpu.pipeline(&PLAIN, "main", &[]).expect("plain"), gpu.pipeline(&WITH_INCLUDE, "main", &[]).expect("with include"));
    assert!(!std::sync::Arc::ptr_eq(&p1, &p2), "shaders of one file with different includes share a pipeline");
    let p3 = gpu.pipeline(&WITH_HEAD, "main", &[]).expect("with head");
    assert!(!std::sync::Arc::ptr_eq(&p1, &p3), "shaders of one file with different heads share a pipeline");
    assert!(std::sync::Arc::ptr_eq(&p2, &gpu.pipeline(&WITH_INCLUDE, "main", &[]).expect("again")), "the pipeline is not cached");
}

/// Q4_K and Q6_K weights repacked at load (`execution.cpuRepack`, the `X8`
/// layout) give every CPU kernel that takes them the results of the row layout:
/// the decode dots through their 8-row path, everything else through the
/// gathered blocks. Shapes of whole groups of 8 rows (the repack leaves other
/// matrices as they are).
fn repacked_k_quant_weights_give_the_row_layout_results() {
    use ktune_kernels::kernels::DType;
    for dtype in [DType::Q4_K, DType::Q6_K] {
        let runs = repacked_weights_give_the_row_layout_results(dtype);
        counted(runs);
        assert!(runs >= 10, "{dtype}: only {runs} repacked runs");
    }
}

/// The same for the 32-element formats with a repacked layout (Q4_0, Q8_0,
/// IQ4_NL: one block column of 8 rows a record).
fn repacked_q4_0_q8_0_iq4_nl_weights_give_the_row_layout_results() {
    use ktune_kernels::kernels::DType;
    for dtype in [DType::Q4_0, DType::Q8_0, DType::IQ4_NL] {
        let runs = repacked_weights_give_the_row_layout_results(dtype);
        counted(runs);
        assert!(runs >= 10, "{dtype}: only {runs} repacked runs");
    }
}

/// Every CPU kernel taking `dtype` on the test shapes, with the weights in rows
/// and repacked: the runs compared.
fn repacked_weights_give_the_row_layout_results(dtype: ktune_kernels::kernels::DType) -> usize {
    use ktune_kernels::kernels::problem::Activation;
    use ktune_kernels::kernels::problem::Problem;
    use ktune_kernels::kernels::quant::Layout;
    use verify::HostTensor;
    let problems = [
        Problem::Gemv { n: 40, k: 512 },
        Problem::Gemv { n: 64, k: 256 },
        Problem::Gemm { m: 5, n: 48, k: 512 },
        Problem::Gemm { m: 1, n: 16, k: 256 },
        Problem::GateUp { rows: 1, n: 24, k: 512, act: Activation::Silu },
        Problem::GateUp { rows: 3, n: 80, k: 256, act: Activation::GeluTanh },
        Problem::QkvProj { k: 512, nq: 32, nkv: 16, bias: true },
        Problem::norm_gemv(72, 256, 1e-6, true),
    ];
    let caps = CpuCaps::detect();
    let mut repacked_runs = 0;
    for k in kernels::registry().iter().filter(|k| k.backend() == Backend::Cpu && k.dtypes.contains(&dtype)) {
        for p in &problems {
            if p.op() != k.op {
                continue;
            }
            let mut param_sets = vec![k.default_params()];
            if k.params.iter().any(|s| s.name == "act_bits") {
                for bits in [8, 32] {
                    let mut ps = k.default_params();
                    ps.insert("act_bits".into(), bits);
                    param_sets.push(ps);
                }
            }
            for params in param_sets {
                if k.check(Caps::Cpu(&caps), p, dtype, &params).is_err() {
                    continue;
                }
                let rows = verify::make_inputs(p, dtype, 11);
                let mut packed = false;
                let x8: Vec<HostTensor> = rows
                    .iter()
                    .map(|t| match t {
                        HostTensor::Q(m) if m.can_repack_x8() => {
                            packed = true;
                            HostTensor::Q(m.repack_x8())
                        }
                        t => t.clone(),
                    })
                    .collect();
                assert!(packed, "{} {p:?}: no matrix of whole 8-row groups", k.id);
                assert!(x8.iter().any(|t| matches!(t, HostTensor::Q(m) if matches!(m.layout, Layout::X8 { .. }))));
                let want = verify::run_cpu(k, p, dtype, &params, &rows).expect("row layout runs");
                let got = verify::run_cpu(k, p, dtype, &params, &x8).expect("repacked layout runs");
                for (w, g) in want.iter().zip(&got) {
                    for (i, (a, b)) in w.iter().zip(g).enumerate() {
                        assert!(
                            (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                            "{} {dtype} {p:?} {params:?}: [{i}] rows {a} vs repacked {b}",
                            k.id
                        );
                    }
                }
                repacked_runs += 1;
            }
        }
    }
    repacked_runs
}

/// Every kernel accepts at least one of its op's test shapes for every storage
/// type it lists (default parameters, or another `isa` where this CPU lacks the
/// default's; WGSL kernels on a typical GPU's limits):
/// the tuner's parity gate admits a variant only through those shapes, so a
/// missing one silently drops the kernel from every race on that type (the
/// K-quant prefill gate/up kernels were, until a whole-super-block prefill shape).
fn every_kernel_and_storage_type_has_a_test_shape() {
    use ktune_kernels::kernels::problem::test_problems;
    let cpu = CpuCaps::detect();
    let gpu = ktune_kernels::testing::typical_gpu_caps();
    // The matrix-unit GEMMs (and gate_up) on a GPU that has matrix units (16x16x16 f16 -> f32,
    // subgroups of 32, as NVIDIA's Vulkan driver reports).
    let coop = ktune_kernels::device::GpuCaps {
        subgroup_min_size: 32,
        subgroup_max_size: 32,
        max_workgroup_storage: 49152,
        max_invocations_per_workgroup: 1024,
        max_workgroup_size: [1024, 1024, 64],
        coop_matrix: [8, 16].map(|m| ktune_kernels::device::CoopShape { m, n: m, k: m, ab: "f16", cr: "f32" }).to_vec(),
        ..ktune_kernels::testing::typical_gpu_caps()
    };
    let mut missing = Vec::new();
    for k in kernels::registry() {
        let caps = match k.backend() {
            Backend::Cpu => Caps::Cpu(&cpu),
            _ if k.id.contains("_coop") => Caps::Gpu(&coop),
            _ => Caps::Gpu(&gpu),
        };
        // The defaults, and each `isa` the kernel has: an instruction set this
        // CPU lacks (the int8 GEMMs' AVX-512 VNNI on an AVX2 machine) is not a
        // missing shape, and the gate races the portable form there.
        let mut sets = vec![k.default_params()];
        for spec in k.params.iter().filter(|s| s.name == "isa") {
            for &v in spec.values {
                let mut p = k.default_params();
                p.insert("isa".into(), v);
                sets.push(p);
            }
        }
        for &d in k.dtypes {
            if !test_problems(k.op).iter().any(|p| sets.iter().any(|params| k.check(caps, p, d, params).is_ok())) {
                missing.push(format!("{} on {d}", k.id));
            }
        }
    }
    assert!(missing.is_empty(), "no test shape accepted:\n{}", missing.join("\n"));
}

/// The fused residual add + LayerNorm (`residual_layer_norm`, the vision tower's
/// norm after each residual) gives what the unfused sequence gives: a registered
/// `residual_add` then a registered `layer_norm` over its sum. Every fused
/// kernel (the CPU ones, and the WGSL ones on the test GPU) at every parameter
/// value of the sweep, on the op's test shapes with the stream shifted far from
/// zero (the variance must be centred), f32 and f16 weights: the stream `h`
/// bit for bit (one f32 add per element either way), the norm to 1e-5 of its scale.
fn residual_layer_norm_is_residual_add_then_layer_norm() {
    use ktune_kernels::kernels::problem::test_problems;
    use ktune_kernels::kernels::verify::HostTensor;
    use ktune_kernels::kernels::{DType, Op, Params, Problem};
    let gpu = test_gpu();
    let cpu = CpuCaps::detect();
    let add_k = kernels::find("residual_add_simd_cpu").expect("residual_add_simd_cpu");
    let ln_k = kernels::find("layer_norm_rows_cpu").expect("layer_norm_rows_cpu");
    let mut checked = (0, 0);
    for prob in test_problems(Op::ResidualLayerNorm) {
        let Problem::ResidualLayerNorm { rows, dim, eps } = prob else { panic!("{prob:?}") };
        for dtype in [DType::F32, DType::F16] {
            let mut ins = verify::make_inputs(&prob, dtype, 7);
            if let HostTensor::F32(x) = &mut ins[0] {
                x.iter_mut().enumerate().for_each(|(i, v)| *v += 50.0 + (i % 3) as f32);
            }
            let add = Problem::ResidualAdd { n: rows * dim };
            let h = verify::run_cpu(add_k, &add, DType::F32, &add_k.default_params(), &ins[..2]).expect("residual_add").remove(0);
            let ln = Problem::LayerNorm { rows, dim, eps };
            let ln_ins = [HostTensor::F32(h.clone()), ins[2].clone(), ins[3].clone()];
            let y = verify::run_cpu(ln_k, &ln, dtype, &ln_k.default_params(), &ln_ins).expect("layer_norm").remove(0);
            let scale = y.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
            for k in kernels::for_op(Op::ResidualLayerNorm) {
                let caps = match (k.backend(), &gpu) {
                    (Backend::Cpu, _) => Caps::Cpu(&cpu),
                    (_, Some(g)) => Caps::Gpu(&g.caps),
                    (_, None) => continue,
                };
                for params in verify::param_sweep(k, false) {
                    if k.check(caps, &prob, dtype, &params).is_err() {
                        continue;
                    }
                    let outs = match (&gpu, k.backend()) {
                        (Some(g), Backend::Wgsl) => verify::run_gpu(g, k, &prob, dtype, &params, &ins),
                        _ => verify::run_cpu(k, &prob, dtype, &params, &ins),
                    }
                    .unwrap_or_else(|e| panic!("{} {params:?} at {prob:?}: {e}", k.id));
                    let what = |p: &Params| format!("{} {p:?} at {} on {dtype}", k.id, prob.describe());
                    assert!(outs[0] == h, "h differs from residual_add: {}", what(&params));
                    let err = outs[1].iter().zip(&y).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
                    assert!(err <= 1e-5, "y differs from layer_norm by {err:.2e} of scale: {}", what(&params));
                    if k.backend() == Backend::Cpu {
                        checked.0 += 1;
                    } else {
                        checked.1 += 1;
                    }
                }
            }
        }
    }
    assert!(checked.0 > 0, "no CPU check ran");
    counted(checked.0 + checked.1);
    assert!(gpu.is_none() || checked.1 > 0, "no WGSL check ran");
}

/// The matrix-tile GEMMs with two tile buffers (`stages = 2`) at tilings the
/// one-axis sweep does not reach: the deepest step (tile_k 64, 8 slots of the
/// weights an invocation), 8x8 matrices, and a tile of one 8-row matrix over 4
/// subgroups (x's one slot only partly used), over block formats and floats, gemm
/// and gate_up, on every test shape of the op (odd chunk counts included: the
/// fetch past the last chunk must stage zeros).
fn two_stage_matrix_tilings_match_reference() {
    use ktune_kernels::kernels::DType;
    let Some(gpu) = test_gpu() else { return };
    let sets: [&[(&str, u32)]; 3] = [
        &[("stages", 2), ("tile_k", 64), ("mat_m", 1)],
        &[("stages", 2), ("mat", 8)],
        &[("stages", 2), ("mat", 8), ("sg_m", 1), ("sg_n", 4), ("mat_m", 1), ("mat_n", 1)],
    ];
    let (mut checks, mut failures) = (0, Vec::new());
    for id in ["gemm_q_mma_emu", "gemm_mma_emu", "gate_up_q_mma_emu", "gate_up_mma_emu"] {
        let k = kernels::find(id).expect("registered");
        let mut ran = 0;
        for set in sets {
            let mut params = k.default_params();
            for &(name, v) in set {
                params.insert(name.to_string(), v);
            }
            for dtype in [DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::F32, DType::F16].into_iter().filter(|d| k.dtypes.contains(d)) {
                for (qi, problem) in kernels::problem::test_problems(k.op).iter().enumerate() {
                    if k.check(Caps::Gpu(&gpu.caps), problem, dtype, &params).is_err() {
                        continue;
                    }
                    let c = verify::check_one(&Runner::Gpu(&gpu), k, problem, dtype, &params, 0x5eed ^ qi as u64);
                    ran += 1;
                    if !c.passed {
                        failures.push(format!("{id} {dtype} {params:?} {}: rel err {:.3e} {:?}", c.problem, c.rel_err, c.error));
                    }
                }
            }
        }
        assert!(ran > 0, "{id}: no two-stage tiling valid on {}", gpu.name);
        checks += ran;
        counted(ran);
    }
    assert!(failures.is_empty(), "{} of {checks} two-stage checks failed:\n{}", failures.len(), failures.join("\n"));
}
