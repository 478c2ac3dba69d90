//! The CPU sampler's cost per token at the vocabularies of SmolLM2 / Llama-sized
//! tokenizers (49152) and Gemma 3 (262144): greedy, temperature 1 with every
//! filter off, top-p alone, and llama.cpp's defaults (temperature 0.8, top-k 40,
//! top-p 0.95, min-p 0.05), each over random logits (uniform in [-8, 8)), with a
//! repeat penalty over the last 64 ids in the last case. Best and median of 15
//! runs of `reps` samples, in ns per sample.
//!
//!     cargo bench -p ktune-bench --bench sample

use std::time::Instant;

use ktune_kernels::kernels::sample::{Sampler, SamplerParams};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn main() {
    let off = SamplerParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 1, ..SamplerParams::GREEDY };
    let configs = [
        ("greedy", SamplerParams::GREEDY),
        ("temperature 1, no filter", off),
        ("temperature 0.8, top-p 0.95", SamplerParams { temperature: 0.8, top_p: 0.95, ..off }),
        ("llama.cpp defaults + penalty 1.1/64", SamplerParams { temperature: 0.8, repeat_penalty: 1.1, seed: 1, ..SamplerParams::GREEDY }),
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for vocab in [49_152usize, 262_144] {
        let logits: Vec<f32> = (0..vocab).map(|_| rng.random_range(-8.0f32..8.0)).collect();
        let reps = if vocab > 100_000 { 20 } else { 80 };
        for (name, p) in configs {
            let mut s = Sampler::new(p);
            let mut sink = 0u64;
            for _ in 0..reps {
                sink += s.sample(&logits) as u64;
            }
            let mut ns = Vec::new();
            for _ in 0..15 {
                let t = Instant::now();
                for _ in 0..reps {
                    sink += s.sample(&logits) as u64;
                }
                ns.push(t.elapsed().as_secs_f64() * 1e9 / reps as f64);
            }
            ns.sort_by(f64::total_cmp);
            println!("vocab {vocab:>6} {name:<36} best {:>10.0} ns/sample, median {:>10.0} (ids sum {sink})", ns[0], ns[ns.len() / 2]);
        }
    }
}
