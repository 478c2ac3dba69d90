//! A/B of the f32-activation decode dots (`act_bits` 32) on a
//! Gemma 3 4B LM-head shape (262144 x 2560): the row layout (one row's block dot
//! at a time), the repacked X8 layout through its 8-row loop (`qx8::rows_x8_f32`,
//! what `ActVec::F32` rows over X8 records take), and, for reference, the path X8
//! records took before that loop (each block gathered back to its split form,
//! then dotted), timed once. Single-threaded, then the first two on the
//! kernels' pool over rows (64 rows a task, as `gemv_q_cpu` by default). Best
//! and median of the runs, GB/s of weight bytes.
//!
//!     cargo bench -p ktune-bench --bench qx8_f32 [-- q4_0 q8_0 q4_k iq4_nl] [--rows N]
//!
//! Formats default to q4_0 (the profile where the gather showed up: `tune
//! --model gemma3-4b --weight-dtype q4_0`, "repacked q4_0").

use std::time::Instant;

use ktune_kernels::kernels::cpu::{ActVec, Isa, RowSplit, dot_q, par_rows, pool};
use ktune_kernels::kernels::quant::{Layout, QFormat, QMatrix, QView};

fn main() {
    let mut formats = Vec::new();
    let mut n = 262_144usize;
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(a) = args.next() {
        if a == "--rows" {
            n = args.next().and_then(|v| v.parse().ok()).expect("--rows N");
        } else {
            formats.push(a.parse::<QFormat>().unwrap_or_else(|_| panic!("unknown format `{a}`")));
        }
    }
    if formats.is_empty() {
        formats.push(QFormat::Q4_0);
    }
    let k = 2560usize;
    let isa = Isa::best();
    let x: Vec<f32> = (0..k).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
    for f in formats {
        let m = build(f, n, k);
        let x8 = m.repack_x8();
        assert!(matches!(x8.layout, Layout::X8 { .. }), "{f}: not repacked");
        let bytes = (m.quants.len() + 2 * m.scales.len()) as f64;
        let act = ActVec::F32(&x);
        let (mut y_rows, mut y_x8) = (vec![0f32; n], vec![0f32; n]);
        let (mut t_rows, mut t_x8, mut t_x8_256) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..7 {
            let t = Instant::now();
            act.rows(isa, m.view(), k, 0, &mut y_rows, false);
            t_rows.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            act.rows(isa, x8.view(), k, 0, &mut y_x8, false);
            t_x8.push(t.elapsed().as_secs_f64());
            if isa != Isa::Simd256 {
                let t = Instant::now();
                act.rows(Isa::Simd256, x8.view(), k, 0, &mut y_x8, false);
                t_x8_256.push(t.elapsed().as_secs_f64());
            }
        }
        let threads = pool::pool().threads();
        let (mut p_rows, mut p_x8) = (Vec::new(), Vec::new());
        for _ in 0..7 {
            let t = Instant::now();
            par_rows(&mut y_rows, 1, RowSplit::Dynamic(64), |first, y| act.rows(isa, m.view(), k, first, y, false));
            p_rows.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            par_rows(&mut y_x8, 1, RowSplit::Dynamic(64), |first, y| act.rows(isa, x8.view(), k, first, y, false));
            p_x8.push(t.elapsed().as_secs_f64());
        }
        let t = Instant::now();
        let y_gather = gathered(isa, &x, x8.view(), n, k);
        let t_gather = t.elapsed().as_secs_f64();
        let worst =
            y_rows.iter().zip(&y_x8).chain(y_rows.iter().zip(&y_gather)).fold(0f32, |m, (a, b)| m.max((a - b).abs() / (1.0 + a.abs())));
        let show = |name: &str, t: &mut Vec<f64>| {
            t.sort_by(f64::total_cmp);
            println!(
                "{f} {n}x{k} {name}: best {:.1} ms ({:.2} GB/s), median {:.1} ms over {} runs",
                t[0] * 1e3,
                bytes / t[0] / 1e9,
                t[t.len() / 2] * 1e3,
                t.len()
            );
        };
        show("rows f32        ", &mut t_rows);
        show(&format!("x8 f32 (8-row, isa {isa:?})"), &mut t_x8);
        if !t_x8_256.is_empty() {
            show("x8 f32 (8-row, isa Simd256)", &mut t_x8_256);
        }
        show(&format!("rows f32, {threads} threads  "), &mut p_rows);
        show(&format!("x8 f32, {threads} threads    "), &mut p_x8);
        println!("{f} {n}x{k} x8 f32 (gathered): {:.1} ms ({:.2} GB/s), one run", t_gather * 1e3, bytes / t_gather / 1e9);
        println!("{f}: largest difference from the row layout {worst:.2e} (relative to 1 + |y|)");
    }
}

/// An `n x k` matrix of `format` quantized 8192 rows at a time (no f32 copy of the whole).
fn build(format: QFormat, n: usize, k: usize) -> QMatrix {
    let chunk = 8192.min(n);
    let mut m: Option<QMatrix> = None;
    for r0 in (0..n).step_by(chunk) {
        let rows = chunk.min(n - r0);
        let w: Vec<f32> = (0..rows * k).map(|i| (((r0 * k + i) * 31 % 17) as f32 - 8.0) * 0.01).collect();
        let part = QMatrix::quantize(format, rows, k, &w).expect("quantizes");
        match m.as_mut() {
            None => m = Some(part),
            Some(m) => {
                m.rows += rows;
                m.quants.extend_from_slice(&part.quants);
                m.scales.extend_from_slice(&part.scales);
            }
        }
    }
    m.expect("at least one row")
}

/// The X8 f32 path before the 8-row loop: every block gathered back, then dotted.
fn gathered(isa: Isa, x: &[f32], w: QView<'_>, n: usize, k: usize) -> Vec<f32> {
    let Layout::X8 { bpr } = w.layout else { unreachable!("an X8 view") };
    let be = w.format.block_elems();
    assert_eq!(bpr * be, k);
    (0..n)
        .map(|r| {
            (0..bpr)
                .map(|c| {
                    w.with_block(r * bpr + c, |q, s| {
                        dot_q(isa, &x[be * c..be * (c + 1)], QView { format: w.format, quants: q, scales: s, layout: Layout::Rows })
                    })
                })
                .sum()
        })
        .collect()
}
