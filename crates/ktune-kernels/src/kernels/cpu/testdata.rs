//! Deterministic test inputs for the kernel unit tests: one seeded ChaCha8 stream
//! per call, so every test draws its data the same way.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `n` values uniform in `[lo, hi)` from the stream of `seed`.
pub fn uniform(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// `n` values uniform in `[-1, 1)` from the stream of `seed`.
pub fn signed(n: usize, seed: u64) -> Vec<f32> {
    uniform(n, seed, -1.0, 1.0)
}
