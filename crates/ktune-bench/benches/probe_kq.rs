//! Single-threaded block-format GEMV rates, rows layout against the X8 repack,
//! with the matrix in cache (256 rows) and in memory (32768 rows), int8
//! activations, best of N: how close each decode kernel is to compute-bound.
//!
//!     cargo bench -p ktune-bench --bench probe_kq
//!
//! Measured (2-core EPYC Zen 4, other work paused): q4_k rows 18.6 GB/s hot,
//! 15.7 in memory; X8 44.7 and 20.7; q6_k rows 24.6 and 18.0; q8_0 rows 39.4
//! and 10.0, X8 73.8 and 23.3. Two threads share ~36-42 GB/s of read bandwidth,
//! so with both cores streaming, rows and X8 Q4_K decode alike (measured e2e:
//! +0.1%).

use ktune_kernels::kernels::cpu::{ActVec, Isa, XQ8};
use ktune_kernels::kernels::quant::{QFormat, QMatrix};
use std::time::Instant;
fn main() {
    let k = 2048usize;
    let x: Vec<f32> = (0..k).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
    for f in [QFormat::Q4_K, QFormat::Q6_K, QFormat::Q8_0] {
        for n in [256usize, 32768] {
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 31 % 17) as f32 - 8.0) * 0.01).collect();
            let m = QMatrix::quantize(f, n, k, &w).unwrap();
            let bytes = (m.quants.len() + 2 * m.scales.len()) as f64;
            let xq = ActVec::I8(if matches!(f, QFormat::Q8_0) { XQ8::quantize(&x) } else { XQ8::quantize_k(&x) });
            let mut y = vec![0f32; n];
            let reps = if n == 256 { 2000 } else { 20 };
            let mut best = f64::MAX;
            for _ in 0..reps {
                let t = Instant::now();
                xq.rows(Isa::best(), m.view(), k, 0, &mut y, true);
                best = best.min(t.elapsed().as_secs_f64());
            }
            let line = format!("{f} n={n}: rows {:.1} GB/s", bytes / best / 1e9);
            let mx = if m.can_repack_x8() { Some(m.clone().repack_x8()) } else { None };
            if let Some(mx) = mx {
                let mut best = f64::MAX;
                for _ in 0..reps {
                    let t = Instant::now();
                    xq.rows(Isa::best(), mx.view(), k, 0, &mut y, true);
                    best = best.min(t.elapsed().as_secs_f64());
                }
                println!("{line}, x8 {:.1} GB/s", bytes / best / 1e9);
            } else {
                println!("{line}");
            }
        }
    }
}
