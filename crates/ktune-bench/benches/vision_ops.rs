//! Times every CPU kernel of the vision tower's ops (default parameters) at one
//! layer's shapes of a SigLIP tower, and the ops' share of a layer with the
//! kernels the tower picks by default (`VisionEngine`'s choice: the CPU preference
//! list, else the first valid kernel). Default: gemma3-4b's tower (896 px, 14 px
//! patches: 4096 patches, width 1152, 16 heads, MLP 4304).
//!
//!     cargo bench -p ktune-bench --bench vision_ops                  # every kernel, median of 3
//!     cargo bench -p ktune-bench --bench vision_ops -- 448 1        # 448 px, 1 run each
//!     cargo bench -p ktune-bench --bench vision_ops -- 896 3 linear # only kernels whose id contains "linear"
//!     cargo bench -p ktune-bench --bench vision_ops -- 896 9 norm,residual_add   # ids containing either (the fusion's comparison)
//!     cargo bench -p ktune-bench --bench vision_ops -- 896 3 flash block_k=512   # parameters set where a kernel has them
//!
//! Prints seconds per call, GFLOP/s, and each op's seconds per layer (times its
//! count in a layer) for the default kernel. A layer runs each residual add fused
//! with the LayerNorm after it (`residual_layer_norm`, twice); the unfused pair
//! (`residual_add` then `layer_norm`, the tower's sequence before the fusion) is
//! timed too and compared at the end.

use std::time::Instant;

use ktune_kernels::device::CpuCaps;
use ktune_kernels::kernels::preferred::preferred;
use ktune_kernels::kernels::verify::{make_inputs, output_lens};
use ktune_kernels::kernels::{self, Backend, Caps, CpuArgs, DType, Problem};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let image: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(896);
    let runs: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3).max(1);
    let filter = args.get(2).cloned().unwrap_or_default();
    let set: Vec<(String, u32)> = args[3.min(args.len())..]
        .iter()
        .filter_map(|a| a.split_once('=').and_then(|(n, v)| Some((n.to_string(), v.parse().ok()?))))
        .collect();
    let (h, inter, heads, patch) = (1152usize, 4304usize, 16usize, 14usize);
    let n = (image / patch) * (image / patch);
    let d = h / heads;
    let shapes: Vec<(Problem, usize)> = vec![
        (Problem::PatchEmbed { channels: 3, image, patch, hidden: h }, 0),
        (Problem::LayerNorm { rows: n, dim: h, eps: 1e-6 }, 0),
        (Problem::ResidualLayerNorm { rows: n, dim: h, eps: 1e-6 }, 2),
        (Problem::Linear { m: n, n: h, k: h, gelu: false }, 4),
        (Problem::AttentionFull { tokens: n, heads, head_dim: d, scale: (d as f32).powf(-0.5) }, 1),
        (Problem::ResidualAdd { n: n * h }, 0),
        (Problem::Linear { m: n, n: inter, k: h, gelu: true }, 1),
        (Problem::Linear { m: n, n: h, k: inter, gelu: false }, 1),
    ];
    let caps = CpuCaps::detect();
    let mut layer = 0.0;
    let mut default_s = std::collections::BTreeMap::new();
    for (p, count) in &shapes {
        let ins = make_inputs(p, DType::F32, 1);
        let mut outs: Vec<Vec<f32>> = output_lens(p, DType::F32).into_iter().map(|l| vec![0f32; l]).collect();
        let default = preferred(p, Backend::Cpu)
            .iter()
            .filter_map(|id| kernels::find(id).ok())
            .chain(kernels::for_op(p.op()).filter(|k| k.backend() == Backend::Cpu))
            .find(|k| k.check(Caps::Cpu(&caps), p, DType::F32, &k.default_params()).is_ok())
            .map(|k| k.id);
        for k in kernels::for_op(p.op()).filter(|k| k.backend() == Backend::Cpu && filter.split(',').any(|f| k.id.contains(f))) {
            let mut params = k.default_params();
            for (n, v) in &set {
                if let Some(p) = params.get_mut(n) {
                    *p = *v;
                }
            }
            if k.check(Caps::Cpu(&caps), p, DType::F32, &params).is_err() {
                continue;
            }
            let mut times = Vec::new();
            for _ in 0..runs {
                let args =
                    CpuArgs { ins: ins.iter().map(|t| t.as_in()).collect(), outs: outs.iter_mut().map(|v| v.as_mut_slice()).collect() };
                let t0 = Instant::now();
                k.run_cpu(p, DType::F32, &params, args).expect("runs");
                times.push(t0.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            let t = times[times.len() / 2];
            let mark = if Some(k.id) == default { "*" } else { " " };
            println!("{mark} {:<28} {:<60} {:>9.4} s {:>8.1} GFLOP/s", k.id, p.describe(), t, p.flops() / t / 1e9);
            if Some(k.id) == default {
                layer += t * *count as f64;
                default_s.insert(p.op(), t);
            }
        }
    }
    println!("one layer with the default kernels (*): {layer:.3} s");
    let get = |op| default_s.get(&op).copied();
    if let (Some(add), Some(ln), Some(fused)) =
        (get(kernels::Op::ResidualAdd), get(kernels::Op::LayerNorm), get(kernels::Op::ResidualLayerNorm))
    {
        println!(
            "residual add + LayerNorm at {n} x {h}: unfused (residual_add + layer_norm) {:.2} ms, fused (residual_layer_norm) {:.2} ms: {:.2}x",
            (add + ln) * 1e3,
            fused * 1e3,
            (add + ln) / fused
        );
    }
}
