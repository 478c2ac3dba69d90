//! A/B of the mixture-of-experts CPU kernels at Qwen3-30B-A3B's shapes (128
//! experts of width 768 over hidden 2048, 8 a token, Q4_K weights): the gathered
//! kernels (`moe_gate_up_cpu`, `moe_down_cpu`: each slot's expert rows dotted
//! with its token, int8 activations) against the grouped ones
//! (`moe_gate_up_grouped_cpu`, `moe_down_grouped_cpu`: tokens sorted by expert,
//! each expert's rows dequantized once into f32 panels for the blocked GEMM;
//! `_grouped_i8`: its tokens quantized once, its rows through the int8 GEMM tiles), at
//! one token (decode) and at a prefill of `--rows` tokens (default 128). Rounds
//! interleave the kernels; median and range of the rounds, GFLOP/s of the
//! problem's work and GB/s of the active experts' bytes.
//!
//!     cargo bench -p ktune-bench --bench moe [-- --rows N --rounds R --dtype D]
//!
//! Also at 8 tokens (a server's decode batch); a kernel that cannot run here
//! (the grouped int8 one without the int8 GEMM's SIMD tiles) is said and left out.
//!
//! Measured (2-core EPYC, nothing else running, medians of 3 runs of 3 rounds):
//! 128 tokens, gate/up gathered 52.0 ms, grouped f32 92.9, grouped int8 41.1;
//! down 38.6, 58.4, 20.5. One token: gate/up 0.39, 6.5, 1.8; down 0.27, 3.5, 0.94.
//! On a 2-core EPYC 7001 (Zen 1, AVX2 without VNNI: the int8 GEMM has no SIMD
//! tiles, its grouped form runs the portable loops), `--rounds 3`, gathered /
//! grouped f32 / grouped int8, ms: Q8_0 at 8 tokens gate/up 23.5, 222, 396,
//! down 9.3, 95.3, 159; at 128 tokens 291, 627, 3973 and 208, 401, 2164. Q4_K
//! at 8 tokens 14.2, 193, 195 and 12.0, 101, 159; at 128 291, 601, 4211 and
//! 192, 331, 2106: there every pass takes the gathered kernel
//! (`Selection::experts_choice`).
//! The grouped f32 kernel's earlier form (each expert row dequantized, then one
//! f32 dot per token) took 141-143 ms and 83-89 ms at 128 tokens.

use std::time::Instant;

use ktune_kernels::kernels::verify::{make_inputs, run_cpu};
use ktune_kernels::kernels::{Activation, DType, Problem, find};

fn main() {
    let mut rows = 128usize;
    let mut rounds = 5usize;
    let mut dtype = DType::Q4_K;
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(a) = args.next() {
        let arg = args.next();
        let v = arg.as_deref().and_then(|v| v.parse().ok());
        match a.as_str() {
            "--rows" => rows = v.expect("--rows N"),
            "--rounds" => rounds = v.expect("--rounds R"),
            "--dtype" => dtype = arg.as_deref().and_then(|d| d.parse().ok()).expect("--dtype q4_k|q8_0|..."),
            _ => panic!("unknown argument `{a}`"),
        }
    }
    let (experts, top_k, ff, h) = (128, 8, 768, 2048);
    for t in [1, 8, rows] {
        let problems = [
            (
                Problem::MoeGateUp { rows: t, experts, top_k, n: ff, k: h, act: Activation::Silu },
                ["moe_gate_up_cpu", "moe_gate_up_grouped_cpu", "moe_gate_up_grouped_i8_cpu"],
            ),
            (
                Problem::MoeDown { rows: t, experts, top_k, n: h, k: ff },
                ["moe_down_cpu", "moe_down_grouped_cpu", "moe_down_grouped_i8_cpu"],
            ),
        ];
        for (p, ids) in problems {
            let ins = make_inputs(&p, dtype, 7);
            let mut times = vec![Vec::new(); ids.len()];
            for round in 0..rounds {
                for (i, id) in ids.iter().enumerate() {
                    let k = find(id).expect("kernel");
                    let mut params = k.default_params();
                    if params.contains_key("act_bits") {
                        params.insert("act_bits".into(), 8);
                    }
                    let t0 = Instant::now();
                    match run_cpu(k, &p, dtype, &params, &ins) {
                        Ok(_) => times[i].push(t0.elapsed().as_secs_f64()),
                        Err(e) if times[i].is_empty() => {
                            if round == 0 {
                                println!("{id}: not run here ({e})");
                            }
                        }
                        Err(e) => panic!("{id}: {e}"),
                    }
                }
            }
            for (id, mut v) in ids.iter().zip(times).filter(|(_, v)| !v.is_empty()) {
                v.sort_by(f64::total_cmp);
                let med = v[v.len() / 2];
                println!(
                    "{:<60} {id:<24} median {:>9.3} ms (range {:.3}–{:.3}) {:>6.1} GFLOP/s {:>6.1} GB/s",
                    p.describe(),
                    med * 1e3,
                    v[0] * 1e3,
                    v[v.len() - 1] * 1e3,
                    p.flops() / med / 1e9,
                    p.min_bytes(dtype) / med / 1e9
                );
            }
        }
    }
}
