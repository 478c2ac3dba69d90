//! Decode-batch GEMMs on the CPU: the int8 GEMM of prefill (`gemm_q_i8_cpu`,
//! its packed panels kept from pass to pass as an engine keeps them) against the batched decode dots
//! (`gemm_q_dots_cpu`, each token's dots as its lone decode's) over plain rows
//! and the repacked X8 records, at 1, 2, 4, 8 and 16 tokens, on SmolLM2-135M's
//! projection shapes, each of its 30 layers its own matrices (and its LM head), on the
//! kernels' pool. Rounds interleave the arms; the median round's milliseconds
//! a step's matrices and the GMAC/s they make, with the range of the rounds.
//!
//!     cargo bench -p ktune-bench --bench batch_gemm [-- q4_0|q4_k ...] [--rounds N] [--tokens 1,8] [--shape 1b]
//!
//! Measured figures are in docs/serve.md ("Two kernels are made for a few sequences").

use std::sync::Arc;
use std::time::Instant;

use ktune_kernels::kernels::contract::CpuArgs;
use ktune_kernels::kernels::cpu::qgemm::{PanelCache, with_panels};
use ktune_kernels::kernels::find;
use ktune_kernels::kernels::problem::Problem;
use ktune_kernels::kernels::quant::{DType, QFormat, QMatrix};
use ktune_kernels::kernels::verify::HostTensor;

/// SmolLM2-135M's matrices (rows, k) and how many of each a step runs.
const SMOLLM2: &[(&str, usize, usize, usize)] =
    &[("qkv", 960, 576, 30), ("o", 576, 576, 30), ("gate_up", 3072, 576, 30), ("down", 576, 1536, 30), ("lm_head", 49152, 576, 1)];
/// Llama 3.2 1B's, four of its 16 layers (`--shape 1b`; the K-quants' rows must
/// be whole super-blocks of 256, which SmolLM2's 576 are not).
const LLAMA_1B: &[(&str, usize, usize, usize)] =
    &[("qkv", 3072, 2048, 4), ("o", 2048, 2048, 4), ("gate_up", 16384, 2048, 4), ("down", 2048, 8192, 4), ("lm_head", 128256, 2048, 1)];

/// A timed kernel: its name here, the kernel, X8 records or plain rows, and
/// parameters past the defaults.
type Arm = (&'static str, &'static str, bool, &'static [(&'static str, u32)]);

fn main() {
    let mut formats = Vec::new();
    let (mut rounds, mut tokens, mut shapes) = (9usize, vec![1usize, 2, 4, 8, 16], SMOLLM2);
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).expect("--rounds N"),
            "--shape" => shapes = if args.next().as_deref() == Some("1b") { LLAMA_1B } else { SMOLLM2 },
            "--tokens" => tokens = args.next().expect("--tokens 1,8").split(',').map(|t| t.parse().expect("a token count")).collect(),
            _ => formats.push(a.parse::<QFormat>().unwrap_or_else(|_| panic!("unknown format `{a}`"))),
        }
    }
    if formats.is_empty() {
        formats.push(QFormat::Q4_0);
    }
    let threads = ktune_kernels::kernels::cpu::pool::pool().threads();
    println!("{threads} threads, {rounds} rounds; ms a step's matrices (median, range), GMAC/s at the median");
    for f in formats {
        // Every layer's own matrices (a step reads the whole model from memory,
        // as a real one does), plain and repacked.
        let mats: Vec<Vec<[HostTensor; 2]>> = shapes
            .iter()
            .enumerate()
            .map(|(i, &(_, n, k, reps))| {
                (0..reps)
                    .map(|l| {
                        let w: Vec<f32> = (0..n * k).map(|j| (((j * 31 + i * 7 + l) % 17) as f32 - 8.0) * 0.01).collect();
                        let m = QMatrix::quantize(f, n, k, &w).expect("quantized");
                        let x8 = m.repack_x8();
                        [HostTensor::Q(m), HostTensor::Q(x8)]
                    })
                    .collect()
            })
            .collect();
        // The int8 GEMM's VNNI tiles and, where AMX runs, its AMX tiles (`amx` 1).
        let mut arms: Vec<Arm> = vec![
            ("i8 GEMM, rows", "gemm_q_i8_cpu", false, &[]),
            ("i8 GEMM, X8", "gemm_q_i8_cpu", true, &[]),
            ("dots, rows", "gemm_q_dots_cpu", false, &[]),
            ("dots, X8", "gemm_q_dots_cpu", true, &[]),
        ];
        if ktune_kernels::kernels::cpu::qgemm::amx_granted() {
            arms.insert(2, ("i8 X8, AMX", "gemm_q_i8_cpu", true, &[("amx", 1)]));
        }
        // One token's dots on one thread (the lone decode's, `ActVec::rows` over
        // X8 records), best of 200 passes over every layer's matrices: what
        // the batched loop must not slow.
        {
            use ktune_kernels::kernels::cpu::{ActVec, Isa};
            let mut best = f64::MAX;
            let ones = vec![0.25f32; shapes.iter().map(|s| s.2).max().unwrap_or(0)];
            // The activations as the decode quantizes them for this format (one
            // scale per 256 for the K-quants' super-block dots).
            let params = find("gemm_q_dots_cpu").expect("registered").params_with(&[("act_bits", 8)]);
            let xs: Vec<ActVec> = shapes.iter().map(|&(_, _, k, _)| ActVec::new(&ones[..k], &params, f).expect("act_bits 8")).collect();
            let mut y: Vec<Vec<f32>> = shapes.iter().map(|&(_, n, _, _)| vec![0f32; n]).collect();
            for _ in 0..200 {
                let t = Instant::now();
                for (s, &(_, _, k, reps)) in shapes.iter().enumerate() {
                    for layer in mats[s][..reps].iter().take(4) {
                        xs[s].rows(Isa::best(), layer[1].as_in().quant().expect("a block-format matrix"), k, 0, &mut y[s], false);
                    }
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            println!("{f} one token, one thread, 4 layers' matrices over X8: {:.3} ms (best of 200)", best * 1e3);
        }
        for &m in &tokens {
            let macs: f64 = shapes.iter().map(|&(_, n, k, reps)| (m * n * k * reps) as f64).sum();
            let mut times = vec![Vec::new(); arms.len()];
            let inputs: Vec<HostTensor> = shapes
                .iter()
                .map(|&(_, _, k, _)| HostTensor::F32((0..m * k).map(|j| ((j * 7 % 13) as f32 - 6.0) * 0.1).collect()))
                .collect();
            let mut outs: Vec<Vec<f32>> = shapes.iter().map(|&(_, n, _, _)| vec![0f32; m * n]).collect();
            // The int8 GEMM's packed panels kept from pass to pass, as an engine
            // keeps them (the first round packs them): an arm's own cache.
            let panels: Vec<Arc<PanelCache>> = arms.iter().map(|_| Arc::new(PanelCache::default())).collect();
            for _ in 0..rounds {
                for (a, &(_, id, x8, extra)) in arms.iter().enumerate() {
                    let kd = find(id).expect("registered");
                    let params = kd.params_with(&[&[("act_bits", 8)], extra].concat());
                    let t = Instant::now();
                    with_panels(&panels[a], || {
                        for (s, &(_, n, k, reps)) in shapes.iter().enumerate() {
                            let p = Problem::Gemm { m, n, k };
                            for layer in &mats[s][..reps] {
                                let args = CpuArgs {
                                    ins: [inputs[s].as_in(), layer[x8 as usize].as_in()].into_iter().collect(),
                                    outs: [outs[s].as_mut_slice()].into_iter().collect(),
                                };
                                kd.run_cpu(&p, DType::from(f), &params, args).expect("ran");
                            }
                        }
                    });
                    times[a].push(t.elapsed().as_secs_f64());
                }
            }
            for (a, &(name, _, _, _)) in arms.iter().enumerate() {
                let mut v = times[a].clone();
                v.sort_by(f64::total_cmp);
                let med = v[v.len() / 2];
                println!(
                    "{f} m={m:>2} {name:<14} {:>7.3} ms ({:.3}–{:.3})  {:>6.1} GMAC/s",
                    med * 1e3,
                    v[0] * 1e3,
                    v[v.len() - 1] * 1e3,
                    macs / med / 1e9
                );
            }
        }
    }
}
