//! GEMV, the fused RMSNorm + GEMV (`norm_gemv`, decode's input-norm → Q/K/V and
//! → gate/up) and GEMM for every CPU and WGSL kernel (default parameters, every
//! weight dtype it takes: f32, f16 and the block formats q8_0, q4_0, q4_1) at
//! Gemma 3 1B shapes, the CPU ones also with the parameters a quick sweep picks
//! (`cpu-tuned`), plus a memory-bandwidth probe to judge them by.
//!
//! Throughput is reported by criterion: bytes for GEMV and norm_gemv (the bytes actually read:
//! weights as stored, i.e. quants + scales for the block formats, plus the
//! vectors; the op is memory bound; GFLOP/s is 2·n·k over the time) and elements =
//! FLOPs for GEMM (read "Kelem/s" as kFLOP/s, "Gelem/s" as GFLOP/s). WGSL kernels are timed with GPU timestamp queries when
//! the adapter has them, by the wall clock around submit + wait otherwise.
//!
//!     cargo bench -p ktune-bench --bench kernels                 # everything
//!     cargo bench -p ktune-bench --bench kernels -- gemv/cpu     # a subset (criterion filter)
//!     cargo bench -p ktune-bench --bench kernels -- norm_gemv    # the fused norm + GEMV only
//!     KTUNE_BENCH_GPU=0 cargo bench ...           # CPU only
//!     cargo bench -p ktune-bench --bench kernels -- decode_batch # a server's 8-token batch: 30 layers' int8 projections
//!     cargo bench -p ktune-bench --bench kernels -- kv_cache     # decode attention over f32, f16 and q8_0 caches
//!     cargo bench -p ktune-bench --bench kernels -- repack       # Q4_K decode dots: rows vs the repacked X8 layout
//!     cargo bench -p ktune-bench --bench kernels -- vision       # the SigLIP tower's CPU ops at gemma3-4b's shapes
//!     cargo bench -p ktune-bench --bench kernels -- gemm_micro   # the f32 GEMM microkernel's ceiling on this CPU
//!     cargo bench -p ktune-bench --bench kernels -- pool         # the kernels' pool: what a job costs beyond its tasks

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rayon::prelude::*;

use ktune_kernels::device::CpuCaps;
use ktune_kernels::kernels::verify::{GpuBuffers, HostTensor, make_inputs, output_lens};
use ktune_kernels::kernels::{self, Backend, Caps, CpuArgs, DType, KernelDef, Params, Problem, cpu};
use ktune_kernels::testing::test_gpu;

/// Gemma 3 1B: hidden 1152, intermediate 6912. GEMV `n x k` = weight rows x cols.
const GEMV_SHAPES: &[(usize, usize)] = &[(6912, 1152), (1152, 6912), (1152, 1152)];
/// Gemma 3 1B's normed projections: gate (or up) and the fused Q/K/V (4 x 256 + 2 x 256 rows).
const NORM_GEMV_SHAPES: &[(usize, usize)] = &[(6912, 1152), (1536, 1152)];
const PREFILL_T: usize = 128;

fn config() -> Criterion {
    Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2))
}

/// The kernels' pool's own cost a job (what a decode pass pays a few hundred
/// times over): a job of one task a thread that does nothing, and a chunked
/// loop of 64 empty tasks (claims of shrinking runs); each job's start, claims
/// and the wait for its last task.
fn pool_jobs(c: &mut Criterion) {
    let mut g = c.benchmark_group("pool");
    let pool = cpu::pool::pool();
    let threads = pool.threads();
    g.throughput(Throughput::Elements(1));
    g.bench_function(BenchmarkId::new("empty_job", format!("{threads}_tasks")), |b| {
        b.iter(|| {
            pool.run(threads, &|i| {
                black_box(i);
            })
        })
    });
    g.bench_function(BenchmarkId::new("empty_runs", "64_tasks"), |b| {
        b.iter(|| {
            cpu::pool::for_each_run(64, |i| {
                black_box(i);
            })
        })
    });
    g.finish();
}

/// Read bandwidth: a parallel SIMD dot product of a buffer with itself (every byte
/// read once from memory; the second operand hits L1) over 512 MiB (DRAM) and over
/// 1 MiB per thread (cache), with the best instruction set the CPU has.
fn membw(c: &mut Criterion) {
    let mut g = c.benchmark_group("membw");
    let isa = cpu::Isa::best();
    for (name, bytes) in [("dram_512MiB", 512usize << 20), ("cache_1MiB_per_thread", (1usize << 20) * rayon::current_num_threads())] {
        let v: Vec<f32> = (0..bytes / 4).map(|i| (i % 7) as f32).collect();
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                let s: f32 = v.par_chunks(1 << 14).map(|c| cpu::dot_f32(isa, c, c)).sum();
                black_box(s)
            })
        });
    }
    g.finish();
}

fn problems(op: kernels::Op) -> Vec<Problem> {
    match op {
        kernels::Op::Gemv => GEMV_SHAPES.iter().map(|&(n, k)| Problem::Gemv { n, k }).collect(),
        kernels::Op::NormGemv => NORM_GEMV_SHAPES.iter().map(|&(n, k)| Problem::norm_gemv(n, k, 1e-6, true)).collect(),
        _ => GEMV_SHAPES.iter().map(|&(n, k)| Problem::Gemm { m: PREFILL_T, n, k }).collect(),
    }
}

fn throughput(p: &Problem, dtype: DType) -> Throughput {
    match p {
        Problem::Gemv { .. } | Problem::NormGemv { .. } => Throughput::Bytes(p.min_bytes(dtype) as u64),
        _ => Throughput::Elements(p.flops() as u64),
    }
}

fn bench_cpu(c: &mut Criterion, op: kernels::Op) {
    let caps = CpuCaps::detect();
    let mut g = c.benchmark_group(format!("{op}/cpu"));
    for k in kernels::for_op(op).filter(|k| k.backend() == Backend::Cpu) {
        // Defaults, plus int8 activations for the kernels that offer them.
        let mut variants = vec![(String::new(), k.default_params())];
        if k.params.iter().any(|s| s.name == "act_bits") {
            let mut p8 = k.default_params();
            p8.insert("act_bits".into(), 8);
            variants.push(("+act8".into(), p8.clone()));
            if k.params.iter().any(|s| s.name == "rows_per_pass") {
                p8.insert("rows_per_pass".into(), 4);
                variants.push(("+act8x4".into(), p8));
            }
        }
        for &dtype in k.dtypes {
            for (suffix, params) in &variants {
                for p in problems(op) {
                    let params = params.clone();
                    if let Err(why) = k.check(Caps::Cpu(&caps), &p, dtype, &params) {
                        eprintln!("skip {} {dtype} {}: {why}", k.id, p.describe());
                        continue;
                    }
                    let ins = make_inputs(&p, dtype, 1);
                    let mut outs: Vec<Vec<f32>> = output_lens(&p, dtype).into_iter().map(|n| vec![0.0; n]).collect();
                    g.throughput(throughput(&p, dtype));
                    g.bench_function(BenchmarkId::new(format!("{}/{dtype}{suffix}", k.id), shape(&p)), |b| {
                        b.iter(|| {
                            let args = CpuArgs {
                                ins: ins.iter().map(HostTensor::as_in).collect(),
                                outs: outs.iter_mut().map(|v| v.as_mut_slice()).collect(),
                            };
                            k.run_cpu(&p, dtype, &params, args).expect("kernel runs")
                        })
                    });
                }
            }
        }
    }
    g.finish();
}

/// The tuned CPU variants: for each kernel and shape, every parameter set of the
/// tuner's axis sweep (`isa` at its best) is timed three times (median), and the
/// fastest is then measured by criterion as `<kernel>/<dtype>/tuned`. This is what
/// `ktune tune` would pick for that slot; the ids above are the defaults.
fn bench_cpu_tuned(c: &mut Criterion, op: kernels::Op) {
    let caps = CpuCaps::detect();
    let mut g = c.benchmark_group(format!("{op}/cpu-tuned"));
    for k in kernels::for_op(op).filter(|k| k.backend() == Backend::Cpu) {
        let dtype = DType::F32;
        for p in problems(op) {
            let ins = make_inputs(&p, dtype, 1);
            let mut outs: Vec<Vec<f32>> = output_lens(&p, dtype).into_iter().map(|n| vec![0.0; n]).collect();
            let mut run = |params: &Params| {
                let args =
                    CpuArgs { ins: ins.iter().map(HostTensor::as_in).collect(), outs: outs.iter_mut().map(|v| v.as_mut_slice()).collect() };
                k.run_cpu(&p, dtype, params, args).expect("kernel runs")
            };
            let mut best: Option<(f64, Params)> = None;
            for params in kernels::verify::param_sweep(k, false) {
                if params.get("isa").is_some_and(|i| *i != 0) || k.check(Caps::Cpu(&caps), &p, dtype, &params).is_err() {
                    continue;
                }
                run(&params);
                let mut t: Vec<f64> = (0..3)
                    .map(|_| {
                        let s = Instant::now();
                        run(&params);
                        s.elapsed().as_secs_f64()
                    })
                    .collect();
                t.sort_by(f64::total_cmp);
                if best.as_ref().is_none_or(|(b, _)| t[1] < *b) {
                    best = Some((t[1], params));
                }
            }
            let Some((_, params)) = best else { continue };
            let label: Vec<String> = params.iter().filter(|(n, _)| *n != "isa").map(|(n, v)| format!("{n}={v}")).collect();
            eprintln!("tuned {} {}: {}", k.id, shape(&p), label.join(" "));
            g.throughput(throughput(&p, dtype));
            g.bench_function(BenchmarkId::new(format!("{}/{dtype}/tuned", k.id), shape(&p)), |b| b.iter(|| run(&params)));
        }
    }
    g.finish();
}

fn bench_gpu(c: &mut Criterion, op: kernels::Op) {
    if std::env::var("KTUNE_BENCH_GPU").is_ok_and(|v| v == "0") {
        return;
    }
    let Some(gpu) = test_gpu() else { return };
    let mut g = c.benchmark_group(format!("{op}/wgsl"));
    let wgsl: Vec<&KernelDef> = kernels::for_op(op).filter(|k| k.backend() == Backend::Wgsl).collect();
    for k in wgsl {
        for &dtype in k.dtypes {
            for p in problems(op) {
                let params = k.default_params();
                if let Err(why) = k.check(Caps::Gpu(&gpu.caps), &p, dtype, &params) {
                    eprintln!("skip {} {dtype} {}: {why}", k.id, p.describe());
                    continue;
                }
                let ins = make_inputs(&p, dtype, 1);
                let bufs = GpuBuffers::new(&gpu, &p, dtype, &ins);
                let prog = match k.prepare_wgsl(&gpu, &p, dtype, &params, &bufs.refs(), None) {
                    Ok(prog) => prog,
                    Err(e) => {
                        eprintln!("skip {} {dtype}: {e}", k.id);
                        continue;
                    }
                };
                g.throughput(throughput(&p, dtype));
                g.bench_function(BenchmarkId::new(format!("{}/{dtype}", k.id), shape(&p)), |b| {
                    b.iter_custom(|iters| {
                        let reps = iters.min(u32::MAX as u64) as u32;
                        match gpu.time_program(&prog, reps) {
                            Ok(Some(per)) => Duration::from_secs_f64(per * iters as f64),
                            _ => {
                                let t = Instant::now();
                                for _ in 0..iters {
                                    gpu.run(k.id, &[&prog]).expect("kernel runs");
                                }
                                t.elapsed()
                            }
                        }
                    })
                });
            }
        }
    }
    g.finish();
}

fn shape(p: &Problem) -> String {
    match *p {
        Problem::Gemv { n, k } | Problem::NormGemv { n, k, .. } => format!("{n}x{k}"),
        Problem::Gemm { m, n, k } => format!("m{m}_{n}x{k}"),
        _ => p.describe(),
    }
}

fn gemv(c: &mut Criterion) {
    bench_cpu(c, kernels::Op::Gemv);
    bench_cpu_tuned(c, kernels::Op::Gemv);
    bench_gpu(c, kernels::Op::Gemv);
}

fn norm_gemv(c: &mut Criterion) {
    bench_cpu(c, kernels::Op::NormGemv);
    bench_cpu_tuned(c, kernels::Op::NormGemv);
    bench_gpu(c, kernels::Op::NormGemv);
}

fn gemm(c: &mut Criterion) {
    bench_cpu(c, kernels::Op::Gemm);
    bench_cpu_tuned(c, kernels::Op::Gemm);
    bench_gpu(c, kernels::Op::Gemm);
}

/// The ceiling of the CPU GEMMs: the best f32 microkernel of this CPU
/// (`cpu::sgemm::Micro`) on L1/L2-resident panels (MR x 256 by 256 x NR), one tile
/// of C accumulated per call, single-threaded. Throughput in FLOPs.
fn gemm_micro(c: &mut Criterion) {
    use ktune_kernels::kernels::cpu::sgemm::Micro;
    let micro = Micro::for_isa(cpu::Isa::best());
    let (mr, nr, kc) = (micro.mr(), micro.nr(), 256);
    let a: Vec<f32> = (0..mr * kc).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let b: Vec<f32> = (0..nr * kc).map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5).collect();
    let mut cbuf = vec![0f32; mr * nr];
    let mut g = c.benchmark_group("gemm_micro");
    g.throughput(Throughput::Elements(2 * (mr * nr * kc) as u64));
    g.bench_function(format!("{micro:?}"), |bch| {
        // SAFETY: panels of kc*MR / kc*NR floats, cbuf holds one MR x NR tile.
        bch.iter(|| unsafe { micro.run(kc, black_box(&a), black_box(&b), cbuf.as_mut_ptr(), nr, true) })
    });
    g.finish();
    black_box(cbuf[0]);
}

/// The int8 prefill GEMM's work for one pool task, single-threaded: 256 weight
/// rows of 2048 (packed to the interleaved panel, 32 rows at a time as
/// `gemm_q_i8_cpu` with `rows_per_task 32` packs them) times 64 tokens, for
/// the formats packed straight from their bytes (Q8_0, Q4_0) and one packed
/// through the staging rows (Q4_K: own offsets; Q6_K: the folded -128 · scale).
/// Throughput in multiply-adds. And at 8 tokens (a server's decode batch), the
/// rows packed each call against the panels kept (`PanelCache`, what an
/// engine's decode batches use).
fn i8_gemm(c: &mut Criterion) {
    use ktune_kernels::kernels::cpu::qgemm::{I8Kernel, PanelCache, XPanel, rows_times_tokens_i8};
    use ktune_kernels::kernels::quant::{QFormat, QMatrix};
    let mut g = c.benchmark_group("i8_gemm");
    let (rows, k, m) = (256usize, 2048usize, 64usize);
    let w: Vec<f32> = (0..rows * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let x: Vec<f32> = (0..m * k).map(|i| ((i * 104729) % 997) as f32 / 498.5 - 1.0).collect();
    let xp = XPanel::quantize(&x, m, k);
    // One task's block of outputs (`[rows][tokens]`), as the kernels' tasks reuse one.
    let mut out = vec![0f32; 128 * m];
    g.throughput(Throughput::Elements((rows * k * m) as u64));
    for f in [QFormat::Q8_0, QFormat::Q4_0, QFormat::Q4_K, QFormat::Q6_K] {
        let q = QMatrix::quantize(f, rows, k, &w).expect("whole blocks");
        g.bench_function(BenchmarkId::new(format!("{f:?}").to_lowercase(), format!("{rows}x{k}x{m}")), |b| {
            b.iter(|| {
                for r0 in (0..rows).step_by(32) {
                    rows_times_tokens_i8(I8Kernel::vnni(cpu::Isa::best()), &xp, q.view(), r0, 32, None, &mut out);
                    black_box(&out);
                }
            })
        });
    }
    let m8 = 8;
    let xp8 = XPanel::quantize(&x[..m8 * k], m8, k);
    g.throughput(Throughput::Elements((rows * k * m8) as u64));
    for f in [QFormat::Q4_0, QFormat::Q4_1, QFormat::Q4_K] {
        let q = QMatrix::quantize(f, rows, k, &w).expect("whole blocks");
        let kept = PanelCache::default();
        for (how, cache) in [("packed", None), ("kept", Some(&kept))] {
            g.bench_function(BenchmarkId::new(format!("{f:?}_{how}").to_lowercase(), format!("{rows}x{k}x{m8}")), |b| {
                b.iter(|| {
                    // Looked up once a call, as a kernel does.
                    let w = cache.and_then(|c| c.weight(cpu::Isa::best(), q.view(), k));
                    for r0 in (0..rows).step_by(32) {
                        rows_times_tokens_i8(I8Kernel::vnni(cpu::Isa::best()), &xp8, q.view(), r0, 32, w.as_ref(), &mut out);
                        black_box(&out);
                    }
                })
            });
        }
    }
    // A decode batch's stream: kept panels larger than the last-level cache
    // (120 matrices of 1536 x 576, SmolLM2-135M's gate and up projections of
    // 30 layers twice over: 106 M weights, 60 MB of Q4_0 panels), 8 tokens,
    // one thread; the panels come from DRAM each pass, as a server's decode
    // batches read them. In tasks of 32 rows (the default `rows_per_task`)
    // and of 128: each task's panel is a stream of its own.
    let (rows, k) = (1536usize, 576usize);
    let ws: Vec<f32> = (0..rows * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let xs = XPanel::quantize(&x[..m8 * k], m8, k);
    let one = QMatrix::quantize(QFormat::Q4_0, rows, k, &ws).expect("whole blocks");
    let many: Vec<QMatrix> = (0..120).map(|_| one.clone()).collect();
    g.throughput(Throughput::Elements((many.len() * rows * k * m8) as u64));
    g.sample_size(10);
    for per in [32usize, 128] {
        let kept = PanelCache::default();
        g.bench_function(BenchmarkId::new(format!("q4_0_kept_dram_{per}"), format!("120x{rows}x{k}x{m8}")), |b| {
            b.iter(|| {
                for q in &many {
                    let w = kept.weight(cpu::Isa::best(), q.view(), k);
                    for r0 in (0..rows).step_by(per) {
                        rows_times_tokens_i8(I8Kernel::vnni(cpu::Isa::best()), &xs, q.view(), r0, per, w.as_ref(), &mut out);
                        black_box(&out);
                    }
                }
            })
        });
    }
    g.bench_function(BenchmarkId::new("quantize_activations", format!("{m}x{k}")), |b| b.iter(|| black_box(XPanel::quantize(&x, m, k))));
    // One token's row on one thread (a decode projection's activations, or one
    // pool task of the above): the block scale search and the codes alone.
    g.throughput(Throughput::Elements(k as u64));
    g.bench_function(BenchmarkId::new("quantize_row", k), |b| b.iter(|| black_box(cpu::XQ8::quantize(&x[..k]))));
    g.finish();
}

/// The int8 decode dots on the row layout and on the repacked `X8` layout
/// (`execution.cpuRepack`), on the kernels' pool as `gemv_q_cpu` runs them (64 rows
/// a task): Llama 3.2 1B's up projection (8192 x 2048; Q4_K 18.9 MB: cache-resident
/// on a CPU with a 32 MB L3, where the dots' instruction count decides) in Q4_K,
/// Q4_0, Q8_0 and IQ4_NL, and four of them stacked in Q4_K (75 MB, read from DRAM,
/// where both should meet the bandwidth). The row layout of the 32-element formats
/// takes its four-row pass (`rows_per_pass: 4`), as tuned.
fn repack(c: &mut Criterion) {
    use ktune_kernels::kernels::cpu::{ActVec, RowSplit, XQ8, par_rows};
    use ktune_kernels::kernels::quant::{QFormat, QMatrix};
    let mut g = c.benchmark_group("repack");
    let k = 2048;
    for (format, rows) in
        [(QFormat::Q4_K, 8192usize), (QFormat::Q4_K, 32768), (QFormat::Q4_0, 8192), (QFormat::Q8_0, 8192), (QFormat::IQ4_NL, 8192)]
    {
        let x: Vec<f32> = (0..rows * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
        let m = QMatrix::quantize(format, rows, k, &x).expect("whole blocks");
        let x8 = m.repack_x8();
        let k4 = format == QFormat::Q4_K;
        let act = ActVec::I8(if k4 { XQ8::quantize_k(&x[..k]) } else { XQ8::quantize(&x[..k]) });
        let mut y = vec![0f32; rows];
        g.throughput(Throughput::Bytes(m.bytes() as u64));
        for (layout, w) in [("rows", &m), ("x8", &x8)] {
            g.bench_function(BenchmarkId::new(format!("{}_{layout}", format.name()), format!("{rows}x{k}")), |b| {
                b.iter(|| {
                    par_rows(&mut y, 1, RowSplit::Dynamic(64), |first, yc| act.rows(cpu::Isa::best(), w.view(), k, first, yc, !k4));
                    black_box(&y);
                })
            });
        }
    }
    g.finish();
}

/// The vision tower's CPU ops (issue 16) at gemma3-4b's SigLIP shapes (width 1152,
/// 16 heads of 72, MLP 4304): each op's runtime default (the CPU preference list)
/// at 896 px (4096 patches, one image's real work), and every CPU kernel of the op
/// at 448 px (1024 patches: the per-query attention kernels take tens of seconds
/// at 4096). Throughput in FLOPs ("Gelem/s" = GFLOP/s); a layer is 4 of the first
/// Linear, one of each MLP Linear and one attention.
fn vision(c: &mut Criterion) {
    use ktune_kernels::kernels::preferred::preferred;
    let caps = CpuCaps::detect();
    let (h, inter, heads) = (1152usize, 4304usize, 16usize);
    let d = h / heads;
    let shapes = |image: usize| {
        let n = (image / 14) * (image / 14);
        vec![
            Problem::PatchEmbed { channels: 3, image, patch: 14, hidden: h },
            Problem::Linear { m: n, n: h, k: h, gelu: false },
            Problem::Linear { m: n, n: inter, k: h, gelu: true },
            Problem::Linear { m: n, n: h, k: inter, gelu: false },
            Problem::AttentionFull { tokens: n, heads, head_dim: d, scale: (d as f32).powf(-0.5) },
        ]
    };
    let mut g = c.benchmark_group("vision/cpu");
    g.sample_size(10).warm_up_time(Duration::from_millis(200)).measurement_time(Duration::from_secs(3));
    for (image, all) in [(896usize, false), (448, true)] {
        for p in shapes(image) {
            let valid =
                |k: &&KernelDef| k.backend() == Backend::Cpu && k.check(Caps::Cpu(&caps), &p, DType::F32, &k.default_params()).is_ok();
            let default =
                preferred(&p, Backend::Cpu).iter().filter_map(|id| kernels::find(id).ok()).chain(kernels::for_op(p.op())).find(valid);
            let kernels: Vec<&KernelDef> =
                if all { kernels::for_op(p.op()).filter(valid).collect() } else { default.into_iter().collect() };
            let ins = make_inputs(&p, DType::F32, 1);
            let mut outs: Vec<Vec<f32>> = output_lens(&p, DType::F32).into_iter().map(|n| vec![0.0; n]).collect();
            g.throughput(Throughput::Elements(p.flops() as u64));
            for k in kernels {
                let params = k.default_params();
                g.bench_function(BenchmarkId::new(k.id, format!("{image}px/{}", p.describe())), |b| {
                    b.iter(|| {
                        let args = CpuArgs {
                            ins: ins.iter().map(HostTensor::as_in).collect(),
                            outs: outs.iter_mut().map(|v| v.as_mut_slice()).collect(),
                        };
                        k.run_cpu(&p, DType::F32, &params, args).expect("kernel runs")
                    })
                });
            }
        }
    }
    g.finish();
}

/// A decode batch's projections through the registry's int8 kernels as an
/// engine runs them (`gemm_q_i8_cpu`, `gate_up_q_i8_cpu`, default parameters,
/// the panels kept across calls): SmolLM2-135M's layer (Q 576, K and V 192, O
/// 576 rows of 576; gate and up 2 x 1536 of 576; down 576 of 1536) in Q4_0,
/// 30 layers of their own weights (the panels come from DRAM, as a server's
/// batches read them), 8 tokens, on the kernels' pool: the arithmetic with each
/// call's quantization, pool runs and output writes.
fn decode_batch_layers(c: &mut Criterion) {
    use ktune_kernels::kernels::cpu::qgemm::{PanelCache, with_panels};
    use ktune_kernels::kernels::problem::Activation;
    let mut g = c.benchmark_group("decode_batch");
    g.sample_size(10);
    let (m, d, kv, ff, layers) = (8usize, 576usize, 192usize, 1536usize, 30usize);
    let dtype = DType::Q4_0;
    let gemm = kernels::find("gemm_q_i8_cpu").expect("registered");
    let gate_up = kernels::find("gate_up_q_i8_cpu").expect("registered");
    let calls: Vec<(&KernelDef, Problem)> = vec![
        (gemm, Problem::Gemm { m, n: d, k: d }),
        (gemm, Problem::Gemm { m, n: kv, k: d }),
        (gemm, Problem::Gemm { m, n: kv, k: d }),
        (gemm, Problem::Gemm { m, n: d, k: d }),
        (gate_up, Problem::GateUp { rows: m, n: ff, k: d, act: Activation::Silu }),
        (gemm, Problem::Gemm { m, n: d, k: ff }),
    ];
    let inputs: Vec<Vec<Vec<HostTensor>>> =
        (0..layers).map(|l| calls.iter().map(|(_, p)| make_inputs(p, dtype, l as u64)).collect()).collect();
    let mut outs: Vec<Vec<f32>> = calls.iter().map(|(_, p)| vec![0.0; output_lens(p, dtype)[0]]).collect();
    let elems: usize = calls
        .iter()
        .map(|(_, p)| match *p {
            Problem::Gemm { m, n, k } => m * n * k,
            Problem::GateUp { rows, n, k, .. } => 2 * rows * n * k,
            _ => 0,
        })
        .sum();
    g.throughput(Throughput::Elements((elems * layers) as u64));
    let panels = std::sync::Arc::new(PanelCache::default());
    g.bench_function(BenchmarkId::new("smollm2_q4_0_layers", format!("{layers}x{m}")), |b| {
        b.iter(|| {
            with_panels(&panels, || {
                for layer in &inputs {
                    for (((k, p), ins), out) in calls.iter().zip(layer).zip(outs.iter_mut()) {
                        let args = CpuArgs {
                            ins: ins.iter().map(HostTensor::as_in).collect(),
                            outs: std::iter::once(out.as_mut_slice()).collect(),
                        };
                        k.run_cpu(p, dtype, &k.default_params(), args).expect("kernel runs");
                    }
                }
            })
        })
    });
    g.finish();
}

/// A decode token's attention over its KV cache in each storage type the CPU
/// kernels read (f32, f16, q8_0: `--kv-dtype`), through the runtime's decode
/// default `attention_decode_heads_cpu`: SmolLM2-135M's heads (9 query, 3 KV,
/// head_dim 64) over 1024 and 4096 cached positions. Throughput: the bytes of
/// the keys and values read, as stored (q8_0: 34 bytes a block of 32). Then
/// a server's decode batch over the paged cache (`attention_paged_cpu`).
fn kv_cache(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv_cache");
    let k = kernels::find("attention_decode_heads_cpu").expect("registered");
    for kv_len in [1024usize, 4096] {
        let p = Problem::AttentionDecode { kv_len, kv_cap: kv_len, heads: 9, kv_heads: 3, head_dim: 64, window: 0, scale: 0.125 };
        for dtype in [DType::F32, DType::F16, DType::Q8_0] {
            let ins = make_inputs(&p, dtype, 1);
            let mut out = vec![0.0f32; output_lens(&p, dtype)[0]];
            g.throughput(Throughput::Bytes(2 * dtype.bytes_for(3 * kv_len * 64)));
            g.bench_function(BenchmarkId::new(format!("decode_heads/{dtype}"), kv_len), |b| {
                b.iter(|| {
                    let args =
                        CpuArgs { ins: ins.iter().map(HostTensor::as_in).collect(), outs: std::iter::once(out.as_mut_slice()).collect() };
                    k.run_cpu(&p, dtype, &k.default_params(), args).expect("kernel runs")
                })
            });
        }
    }
    // A decode batch's attention over the paged cache (`attention_paged_cpu`,
    // the server's kernel): 8 sequences of one token each, 512 cached
    // positions apiece, and 16 of 96 (a server's short chats), in blocks of 64
    // scattered over the pool, SmolLM2-135M's heads. Throughput: the keys and
    // values read, as stored.
    for (seqs, kv_len) in [(8usize, 512usize), (16, 96)] {
        let page = 64usize;
        let per = kv_len.div_ceil(page);
        let blocks = seqs * per;
        let p = Problem::attention_paged((seqs, seqs), (9, 3, 64), (page, blocks, per), 0, 0.125);
        let k = kernels::find("attention_paged_cpu").expect("registered");
        // Each sequence's blocks every 5th of the pool (not side by side).
        let table: Vec<f32> = (0..seqs)
            .flat_map(|s| [1.0, kv_len as f32].into_iter().chain((0..per).map(move |b| ((s * per + b) * 5 % blocks) as f32)))
            .collect();
        for dtype in [DType::F32, DType::F16] {
            let mut ins = make_inputs(&p, dtype, 1);
            ins[3] = HostTensor::F32(table.clone());
            let mut out = vec![0.0f32; output_lens(&p, dtype)[0]];
            g.throughput(Throughput::Bytes(2 * dtype.bytes_for(seqs * 3 * kv_len * 64)));
            g.bench_function(BenchmarkId::new(format!("paged_decode/{dtype}"), format!("{seqs}x{kv_len}")), |b| {
                b.iter(|| {
                    let args =
                        CpuArgs { ins: ins.iter().map(HostTensor::as_in).collect(), outs: std::iter::once(out.as_mut_slice()).collect() };
                    k.run_cpu(&p, dtype, &k.default_params(), args).expect("kernel runs")
                })
            });
        }
    }
    g.finish();
}

/// A decode token's RoPE (`rope_table_cpu`, the runtime's default: SmolLM2's
/// 9 query heads of 64, its tables kept a thread after the first layer) and a
/// decode batch's sequence at a time as a server's pass rotates them; 16
/// tokens of a prompt's chunk (tables computed on the pool).
fn rope(c: &mut Criterion) {
    let mut g = c.benchmark_group("rope");
    let k = kernels::find("rope_table_cpu").expect("registered");
    for tokens in [1usize, 16] {
        let p = Problem::Rope { tokens, heads: 9, head_dim: 64, rot_dim: 64, pos0: 77, layout: kernels::RopeLayout::Half };
        let ins = make_inputs(&p, DType::F32, 1);
        let mut out = vec![0.0f32; output_lens(&p, DType::F32)[0]];
        g.throughput(Throughput::Bytes(2 * 4 * (tokens * 9 * 64) as u64));
        g.bench_function(BenchmarkId::new("table", tokens), |b| {
            b.iter(|| {
                let args =
                    CpuArgs { ins: ins.iter().map(HostTensor::as_in).collect(), outs: std::iter::once(out.as_mut_slice()).collect() };
                k.run_cpu(&p, DType::F32, &k.default_params(), args).expect("kernel runs")
            })
        });
    }
    g.finish();
}

criterion_group! { name = benches; config = config(); targets = pool_jobs, membw, gemv, norm_gemv, gemm, gemm_micro, i8_gemm, decode_batch_layers, kv_cache, rope, repack, vision }
criterion_main!(benches);
