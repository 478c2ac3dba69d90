//! CPU references for every op, accumulated in f64. They define what each op
//! computes: every CPU and WGSL variant is checked against them. Straightforward
//! loops on purpose: they are read, not tuned.

use super::problem::{NormResidual, Problem, RopeLayout};

/// llama3 frequency scaling (Llama 3.1/3.2 `rope_scaling` with `rope_type: llama3`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

/// Inverse frequencies `theta^(-2i/rot_dim)` for `i < rot_dim/2`, with llama3
/// scaling applied as transformers' `_compute_llama3_parameters` does.
pub fn rope_inv_freq(theta: f64, rot_dim: usize, scaling: Option<Llama3Scaling>) -> Vec<f32> {
    (0..rot_dim / 2)
        .map(|i| {
            let f = 1.0 / theta.powf(2.0 * i as f64 / rot_dim as f64);
            let f = match scaling {
                None => f,
                Some(s) => {
                    let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
                    let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen > low_wavelen {
                        f / s.factor
                    } else if wavelen < high_wavelen {
                        f
                    } else {
                        let smooth =
                            (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                        (1.0 - smooth) * f / s.factor + smooth * f
                    }
                }
            };
            f as f32
        })
        .collect()
}

fn rms_row(x: &[f64], w: &[f64], eps: f64, unit: bool) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, g)| v * r * if unit { 1.0 + g } else { *g }).collect()
}

fn rope_head(x: &mut [f64], inv_freq: &[f64], pos: f64, layout: RopeLayout) {
    let half = inv_freq.len();
    for (i, f) in inv_freq.iter().enumerate() {
        let (s, c) = (pos * *f as f32 as f64).sin_cos();
        let (a, b) = match layout {
            RopeLayout::Half => (i, i + half),
            RopeLayout::Interleaved => (2 * i, 2 * i + 1),
        };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0 * c - x1 * s;
        x[b] = x1 * c + x0 * s;
    }
}

/// Causal GQA attention for queries at absolute positions `pos0..pos0+t`, the keys
/// of each as [`super::attention_keys`] says (window, bidirectional block).
#[allow(clippy::too_many_arguments)]
fn attention(
    q: &[f64],
    kc: &[f64],
    vc: &[f64],
    t: usize,
    pos0: usize,
    kv_cap: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    window: usize,
    scale: f64,
    bidi: (usize, usize),
) -> Vec<f64> {
    let group = heads / kv_heads;
    let mut out = vec![0.0; t * heads * d];
    for i in 0..t {
        let pos = pos0 + i;
        let (lo, end) = super::attention_keys(pos, window, bidi);
        for h in 0..heads {
            let kh = h / group;
            let qv = &q[(i * heads + h) * d..][..d];
            let scores: Vec<f64> = (lo..end)
                .map(|j| {
                    let kv = &kc[(kh * kv_cap + j) * d..][..d];
                    qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f64>() * scale
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = e.iter().sum();
            let o = &mut out[(i * heads + h) * d..][..d];
            for (jj, j) in (lo..end).enumerate() {
                let vv = &vc[(kh * kv_cap + j) * d..][..d];
                for c in 0..d {
                    o[c] += e[jj] / z * vv[c];
                }
            }
        }
    }
    out
}

/// What a kernel's output buffers hold before it runs in the parity check, so
/// elements it forgets to write show up as errors; the reference of an op that
/// writes part of a buffer (the fused KV-cache write) leaves it elsewhere.
pub const SENTINEL: f32 = 1.0e4;

/// Computes the outputs of `problem` from its inputs (in binding order, as f64).
/// Returns one vector per output buffer, in binding order.
pub fn compute(problem: &Problem, ins: &[Vec<f64>]) -> Vec<Vec<f64>> {
    match *problem {
        Problem::Gemm { m, n, k } => {
            let (x, w) = (&ins[0], &ins[1]);
            let mut y = vec![0.0; m * n];
            for i in 0..m {
                for j in 0..n {
                    y[i * n + j] = (0..k).map(|c| x[i * k + c] * w[j * k + c]).sum();
                }
            }
            vec![y]
        }
        Problem::Gemv { n, k } => {
            let (x, w) = (&ins[0], &ins[1]);
            vec![(0..n).map(|j| (0..k).map(|c| x[c] * w[j * k + c]).sum()).collect()]
        }
        Problem::AttentionPrefill { tokens, kv_len, kv_cap, heads, kv_heads, head_dim, window, scale, bidi_start, bidi_end } => {
            let bidi = (bidi_start, bidi_end);
            vec![attention(
                &ins[0],
                &ins[1],
                &ins[2],
                tokens,
                kv_len - tokens,
                kv_cap,
                heads,
                kv_heads,
                head_dim,
                window,
                scale as f64,
                bidi,
            )]
        }
        Problem::AttentionDecode { kv_len, kv_cap, heads, kv_heads, head_dim, window, scale } => {
            vec![attention(&ins[0], &ins[1], &ins[2], 1, kv_len - 1, kv_cap, heads, kv_heads, head_dim, window, scale as f64, (0, 0))]
        }
        Problem::RmsNorm { rows, dim, eps, unit_offset } => {
            let mut y = Vec::with_capacity(rows * dim);
            for r in 0..rows {
                y.extend(rms_row(&ins[0][r * dim..][..dim], &ins[1], eps as f64, unit_offset));
            }
            vec![y]
        }
        Problem::LayerNorm { rows, dim, eps } => {
            let mut y = Vec::with_capacity(rows * dim);
            for r in 0..rows {
                let x = &ins[0][r * dim..][..dim];
                let mean = x.iter().sum::<f64>() / dim as f64;
                let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / dim as f64;
                let rs = 1.0 / (var + eps as f64).sqrt();
                y.extend((0..dim).map(|c| (x[c] - mean) * rs * ins[1][c] + ins[2][c]));
            }
            vec![y]
        }
        Problem::Rope { tokens, heads, head_dim, pos0, layout, .. } => {
            let mut y = ins[0].clone();
            for t in 0..tokens {
                for h in 0..heads {
                    rope_head(&mut y[(t * heads + h) * head_dim..][..head_dim], &ins[1], (pos0 + t) as f64, layout);
                }
            }
            vec![y]
        }
        Problem::GatedAct { act, .. } => {
            vec![ins[0].iter().zip(&ins[1]).map(|(g, u)| act.apply_f64(*g) * u).collect()]
        }
        Problem::Softmax { rows, dim } => {
            let mut y = Vec::with_capacity(rows * dim);
            for r in 0..rows {
                let x = &ins[0][r * dim..][..dim];
                let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = x.iter().map(|v| (v - m).exp()).sum();
                y.extend(x.iter().map(|v| (v - m).exp() / z));
            }
            vec![y]
        }
        Problem::ResidualAdd { .. } => vec![ins[0].iter().zip(&ins[1]).map(|(a, b)| a + b).collect()],
        Problem::QkNormRope { tokens, heads, head_dim, pos0, layout, eps, unit_offset, .. } => {
            let mut y = Vec::with_capacity(ins[0].len());
            for t in 0..tokens {
                for h in 0..heads {
                    let mut v = rms_row(&ins[0][(t * heads + h) * head_dim..][..head_dim], &ins[1], eps as f64, unit_offset);
                    rope_head(&mut v, &ins[2], (pos0 + t) as f64, layout);
                    y.extend(v);
                }
            }
            vec![y]
        }
        Problem::QkvRopeCache { heads, kv_heads, head_dim: d, pos0, kv_cap, layout, norm, eps, unit_offset, .. } => {
            let (qkv, gains, freq) = if norm { (&ins[0], Some((&ins[1], &ins[2])), &ins[3]) } else { (&ins[0], None, &ins[1]) };
            let head = |r: usize, g: Option<&Vec<f64>>| {
                let x = &qkv[r * d..][..d];
                let mut v = match g {
                    Some(g) => rms_row(x, g, eps as f64, unit_offset),
                    None => x.to_vec(),
                };
                rope_head(&mut v, freq, pos0 as f64, layout);
                v
            };
            let q: Vec<f64> = (0..heads).flat_map(|h| head(h, gains.map(|g| g.0))).collect();
            let mut kc = vec![SENTINEL as f64; kv_heads * kv_cap * d];
            let mut vc = kc.clone();
            for h in 0..kv_heads {
                let row = (h * kv_cap + pos0) * d;
                kc[row..row + d].copy_from_slice(&head(heads + h, gains.map(|g| g.1)));
                vc[row..row + d].copy_from_slice(&qkv[(heads + kv_heads + h) * d..][..d]);
            }
            vec![q, kc, vc]
        }
        Problem::GateUp { rows, n, k, act } => {
            let (x, w) = (&ins[0], &ins[1]);
            let mut y = vec![0.0; rows * n];
            for r in 0..rows {
                for j in 0..n {
                    let g: f64 = (0..k).map(|c| x[r * k + c] * w[j * k + c]).sum();
                    let u: f64 = (0..k).map(|c| x[r * k + c] * w[(n + j) * k + c]).sum();
                    y[r * n + j] = act.apply_f64(g) * u;
                }
            }
            vec![y]
        }
        Problem::ResidualRmsNorm { rows, dim, eps, unit_offset } => {
            let h: Vec<f64> = ins[0].iter().zip(&ins[1]).map(|(a, b)| a + b).collect();
            let mut y = Vec::with_capacity(rows * dim);
            for r in 0..rows {
                y.extend(rms_row(&h[r * dim..][..dim], &ins[2], eps as f64, unit_offset));
            }
            vec![h, y]
        }
        Problem::ResidualLayerNorm { rows, dim, eps } => {
            let h: Vec<f64> = ins[0].iter().zip(&ins[1]).map(|(a, b)| a + b).collect();
            let mut y = Vec::with_capacity(rows * dim);
            for r in 0..rows {
                let x = &h[r * dim..][..dim];
                let mean = x.iter().sum::<f64>() / dim as f64;
                let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / dim as f64;
                let rs = 1.0 / (var + eps as f64).sqrt();
                y.extend((0..dim).map(|c| (x[c] - mean) * rs * ins[2][c] + ins[3][c]));
            }
            vec![h, y]
        }
        Problem::QkvProj { k, nq, nkv, bias } => {
            let (x, w) = (&ins[0], &ins[1]);
            let n = nq + 2 * nkv;
            let all: Vec<f64> =
                (0..n).map(|j| (0..k).map(|c| x[c] * w[j * k + c]).sum::<f64>() + if bias { ins[2][j] } else { 0.0 }).collect();
            vec![all[..nq].to_vec(), all[nq..nq + nkv].to_vec(), all[nq + nkv..].to_vec()]
        }
        Problem::NormGemv { n, k, eps, unit_offset, residual, act } => {
            let (eps, x) = (eps as f64, &ins[0][..k]);
            let (h, rest): (Vec<f64>, &[Vec<f64>]) = match residual {
                NormResidual::None => (x.to_vec(), &ins[1..]),
                NormResidual::Add => (x.iter().zip(&ins[1]).map(|(a, b)| a + b).collect(), &ins[2..]),
                NormResidual::Normed => {
                    let rn = rms_row(&ins[1][..k], &ins[2][..k], eps, unit_offset);
                    (x.iter().zip(&rn).map(|(a, b)| a + b).collect(), &ins[3..])
                }
            };
            let xn = rms_row(&h, &rest[0][..k], eps, unit_offset);
            let w = &rest[1];
            let dot = |j: usize| (0..k).map(|c| xn[c] * w[j * k + c]).sum::<f64>();
            let y = match act {
                Some(a) => (0..n).map(|j| a.apply_f64(dot(j)) * dot(n + j)).collect(),
                None => (0..n).map(dot).collect(),
            };
            if residual.is_none() { vec![y] } else { vec![y, h] }
        }
        Problem::PatchEmbed { channels, image, patch, hidden } => {
            let (px, w, bias) = (&ins[0], &ins[1], &ins[2]);
            let side = image / patch;
            let kk = channels * patch * patch;
            let mut y = vec![0.0; side * side * hidden];
            for py in 0..side {
                for pxx in 0..side {
                    for j in 0..hidden {
                        let mut acc = bias[j];
                        for c in 0..channels {
                            for ky in 0..patch {
                                for kx in 0..patch {
                                    let pixel = px[(c * image + py * patch + ky) * image + pxx * patch + kx];
                                    acc += pixel * w[j * kk + (c * patch + ky) * patch + kx];
                                }
                            }
                        }
                        y[(py * side + pxx) * hidden + j] = acc;
                    }
                }
            }
            vec![y]
        }
        Problem::Linear { m, n, k, gelu } => {
            let (x, w, bias) = (&ins[0], &ins[1], &ins[2]);
            let gelu_f = |v: f64| if gelu { super::Activation::GeluTanh.apply_f64(v) } else { v };
            vec![(0..m * n).map(|i| gelu_f((0..k).map(|c| x[i / n * k + c] * w[i % n * k + c]).sum::<f64>() + bias[i % n])).collect()]
        }
        Problem::AttentionFull { tokens, heads, head_dim, scale } => {
            // Every query sees every key: causal attention of the last query over all
            // keys, once per query, with the keys in the cache layout.
            let d = head_dim;
            let to_cache = |x: &[f64]| {
                let mut c = vec![0.0; heads * tokens * d];
                for t in 0..tokens {
                    for h in 0..heads {
                        c[(h * tokens + t) * d..][..d].copy_from_slice(&x[(t * heads + h) * d..][..d]);
                    }
                }
                c
            };
            let (kc, vc) = (to_cache(&ins[1]), to_cache(&ins[2]));
            let mut out = Vec::with_capacity(tokens * heads * d);
            for t in 0..tokens {
                let q = &ins[0][t * heads * d..][..heads * d];
                out.extend(attention(q, &kc, &vc, 1, tokens - 1, tokens, heads, heads, d, 0, scale as f64, (0, 0)));
            }
            vec![out]
        }
        Problem::AvgPool { side, kernel, dim } => {
            let out = side / kernel;
            let mut y = vec![0.0; out * out * dim];
            for oy in 0..out {
                for ox in 0..out {
                    for c in 0..dim {
                        let mut s = 0.0;
                        for ky in 0..kernel {
                            for kx in 0..kernel {
                                s += ins[0][((oy * kernel + ky) * side + ox * kernel + kx) * dim + c];
                            }
                        }
                        y[(oy * out + ox) * dim + c] = s / (kernel * kernel) as f64;
                    }
                }
            }
            vec![y]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_matches_transformers_rules() {
        // Llama 3.2: theta 500000, head_dim 64, factor 32, low 1, high 4, orig 8192.
        let s = Llama3Scaling { factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192.0 };
        let plain = rope_inv_freq(500000.0, 64, None);
        let scaled = rope_inv_freq(500000.0, 64, Some(s));
        // High frequencies (short wavelengths) are untouched, low ones divided by the factor.
        assert_eq!(plain[0], scaled[0]);
        let last = plain.len() - 1;
        assert!((scaled[last] - plain[last] / 32.0).abs() < 1e-12);
        // Smooth band lies between the two.
        for i in 0..plain.len() {
            assert!(scaled[i] <= plain[i] && scaled[i] >= plain[i] / 32.0 - 1e-12);
        }
    }

    #[test]
    fn softmax_rows_sum_to_one() {
        let out = compute(&Problem::Softmax { rows: 2, dim: 3 }, &[vec![1.0, 2.0, 3.0, -1.0, 0.0, 100.0]]);
        assert!((out[0][..3].iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!((out[0][5] - 1.0).abs() < 1e-12);
    }

    #[test]
    fn single_key_attention_returns_its_value() {
        let p = Problem::AttentionDecode { kv_len: 1, kv_cap: 2, heads: 2, kv_heads: 1, head_dim: 2, window: 0, scale: 1.0 };
        let out = compute(&p, &[vec![1.0, 2.0, 3.0, 4.0], vec![0.5, 0.5, 9.0, 9.0], vec![7.0, 8.0, 9.0, 9.0]]);
        assert_eq!(out[0], vec![7.0, 8.0, 7.0, 8.0]);
    }
}
