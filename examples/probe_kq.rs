use ktune::kernels::cpu::{ActVec, Isa, XQ8};
use ktune::kernels::quant::{QFormat, QMatrix};
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
