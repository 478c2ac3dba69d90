//! Single-threaded A/B of the int8-activation block dots on AVX2: one weight row
//! per pass against four rows per pass (`rows_per_pass` of gemv_q_cpu), for each
//! block format, on a 6912x1152 matrix (Gemma 3 1B's gate/up shape), best of 200.
//!
//!     cargo bench -p ktune-bench --bench qdot_rows
//!
//! Measured (2-core EPYC, other work paused): q8_0 19.2 vs 17.3 GB/s, q4_0 8.9 vs
//! 8.6, q4_1 6.2 vs 8.6 (one-row vs four-row): hence a tunable, not a fixed choice.

use ktune_kernels::kernels::cpu::Isa;
use ktune_kernels::kernels::cpu::{ActVec, XQ8, dot_q_i8};
use ktune_kernels::kernels::quant::{QFormat, QMatrix};
use std::time::Instant;
fn main() {
    let (n, k) = (6912usize, 1152usize);
    let x: Vec<f32> = (0..k).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
    let w: Vec<f32> = (0..n * k).map(|i| ((i * 31 % 17) as f32 - 8.0) * 0.01).collect();
    for f in [QFormat::Q8_0, QFormat::Q4_0, QFormat::Q4_1] {
        let m = QMatrix::quantize(f, n, k, &w).unwrap();
        let bytes = (m.quants.len() + 2 * m.scales.len()) as f64;
        let xq = ActVec::I8(XQ8::quantize(&x));
        let xq1 = XQ8::quantize(&x);
        let mut y = vec![0f32; n];
        let (mut t1, mut t4) = (f64::MAX, f64::MAX);
        for _ in 0..200 {
            let t = Instant::now();
            for (r, out) in y.iter_mut().enumerate() {
                *out = dot_q_i8(Isa::best(), &xq1, m.view().blocks_range(r * k / 32, k / 32));
            }
            t1 = t1.min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            xq.rows(Isa::best(), m.view(), k, 0, &mut y, true);
            t4 = t4.min(t.elapsed().as_secs_f64());
        }
        println!("{f}: one-row {:.2} GB/s, four-row {:.2} GB/s (single thread, best of 200)", bytes / t1 / 1e9, bytes / t4 / 1e9);
    }
}
