//! CPU references for every op, accumulated in f64. They define what each op
//! computes: every CPU and WGSL variant is checked against them. Straightforward
//! loops on purpose: they are read, not tuned.

use super::problem::{Activation, NormResidual, Problem, RopeLayout};

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
/// of each as [`super::problem::attention_keys`] says (window, bidirectional block).
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
        let (lo, end) = super::problem::attention_keys(pos, window, bidi);
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

/// [`attention`] of each sequence of a paged batch: its blocks' rows gathered
/// into a cache of its own, its queries at the end of its length.
fn attention_paged(
    ins: &[Vec<f64>],
    (seqs, tokens): (usize, usize),
    (heads, kv_heads, d): (usize, usize, usize),
    (page, max_blocks): (usize, usize),
    window: usize,
    scale: f64,
) -> Vec<f64> {
    let (q, kp, vp, pages) = (&ins[0], &ins[1], &ins[2], &ins[3]);
    let mut out = vec![0.0; tokens * heads * d];
    let mut t0 = 0;
    for meta in pages.chunks(2 + max_blocks).take(seqs) {
        let (q_len, kv) = (meta[0] as usize, meta[1] as usize);
        let gather = |pool: &[f64]| {
            let mut c = vec![0.0; kv_heads * kv * d];
            for kh in 0..kv_heads {
                for j in 0..kv {
                    let at = ((meta[2 + j / page] as usize * kv_heads + kh) * page + j % page) * d;
                    c[(kh * kv + j) * d..][..d].copy_from_slice(&pool[at..at + d]);
                }
            }
            c
        };
        let rows = &q[t0 * heads * d..(t0 + q_len) * heads * d];
        let o = attention(rows, &gather(kp), &gather(vp), q_len, kv - q_len, kv, heads, kv_heads, d, window, scale, (0, 0));
        out[t0 * heads * d..(t0 + q_len) * heads * d].copy_from_slice(&o);
        t0 += q_len;
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
        Problem::Gemm { m, n, k } => vec![linear(&ins[0], &ins[1], None, m, n, k, false)],
        Problem::Gemv { n, k } => vec![linear(&ins[0], &ins[1], None, 1, n, k, false)],
        Problem::Linear { m, n, k, gelu } => vec![linear(&ins[0], &ins[1], Some(&ins[2]), m, n, k, gelu)],
        Problem::GateUp { rows, n, k, act } => vec![gate_up(&ins[0], &ins[1], rows, n, k, act)],
        Problem::MoeRoute { rows, experts, top_k, norm } => vec![moe_route(&ins[0], rows, experts, top_k, norm)],
        Problem::MoeGateUp { rows, experts, top_k, n, k, act } => vec![moe_gate_up(ins, rows, experts, top_k, n, k, act)],
        Problem::MoeDown { rows, experts, top_k, n, k } => vec![moe_down(ins, rows, experts, top_k, n, k)],
        Problem::QkvProj { k, nq, nkv, bias } => {
            let all = linear(&ins[0], &ins[1], bias.then(|| &ins[2]), 1, nq + 2 * nkv, k, false);
            vec![all[..nq].to_vec(), all[nq..nq + nkv].to_vec(), all[nq + nkv..].to_vec()]
        }
        Problem::NormGemv { n, k, eps, unit_offset, residual, act, .. } => norm_gemv(ins, n, k, eps as f64, unit_offset, residual, act),
        Problem::AttentionPrefill { tokens, kv_len, kv_cap, heads, kv_heads, head_dim, window, scale, bidi_start, bidi_end } => {
            let bidi = (bidi_start, bidi_end);
            let past = kv_len - tokens;
            vec![attention(&ins[0], &ins[1], &ins[2], tokens, past, kv_cap, heads, kv_heads, head_dim, window, scale as f64, bidi)]
        }
        Problem::AttentionDecode { kv_len, kv_cap, heads, kv_heads, head_dim, window, scale } => {
            vec![attention(&ins[0], &ins[1], &ins[2], 1, kv_len - 1, kv_cap, heads, kv_heads, head_dim, window, scale as f64, (0, 0))]
        }
        Problem::AttentionPaged { seqs, tokens, heads, kv_heads, head_dim, page, max_blocks, window, scale, .. } => {
            vec![attention_paged(ins, (seqs, tokens), (heads, kv_heads, head_dim), (page, max_blocks), window, scale as f64)]
        }
        Problem::AttentionFull { tokens, heads, head_dim, scale } => vec![attention_full(ins, tokens, heads, head_dim, scale as f64)],
        Problem::RmsNorm { rows, dim, eps, unit_offset } => vec![rms_rows(&ins[0], &ins[1], rows, dim, eps as f64, unit_offset)],
        Problem::LayerNorm { rows, dim, eps } => vec![layer_rows(&ins[0], &ins[1], &ins[2], rows, dim, eps as f64)],
        Problem::ResidualRmsNorm { rows, dim, eps, unit_offset } => {
            let h = add(&ins[0], &ins[1]);
            let y = rms_rows(&h, &ins[2], rows, dim, eps as f64, unit_offset);
            vec![h, y]
        }
        Problem::ResidualLayerNorm { rows, dim, eps } => {
            let h = add(&ins[0], &ins[1]);
            let y = layer_rows(&h, &ins[2], &ins[3], rows, dim, eps as f64);
            vec![h, y]
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
        Problem::QkvRopeCache { heads, kv_heads, head_dim, pos0, kv_cap, layout, norm, eps, unit_offset, .. } => {
            let rope = RopeAt { pos0, layout, eps: eps as f64, unit_offset };
            qkv_rope_cache(ins, heads, kv_heads, head_dim, kv_cap, norm, rope)
        }
        Problem::GatedAct { act, .. } => vec![ins[0].iter().zip(&ins[1]).map(|(g, u)| act.apply_f64(*g) * u).collect()],
        Problem::Softmax { rows, dim } => vec![softmax_rows(&ins[0], rows, dim)],
        Problem::ResidualAdd { .. } => vec![add(&ins[0], &ins[1])],
        Problem::PatchEmbed { channels, image, patch, hidden } => vec![patch_embed(ins, channels, image, patch, hidden)],
        Problem::AvgPool { side, kernel, dim } => vec![avg_pool(&ins[0], side, kernel, dim)],
    }
}

/// `a + b`, element by element.
fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| a + b).collect()
}

/// The projections: `y[i][j] = Σ_c x[i][c] · w[j][c]` (+ `bias[j]`), then GELU
/// (tanh) when `gelu`; `m` rows of `x`, `n` of `w`, each of `k`.
fn linear(x: &[f64], w: &[f64], bias: Option<&Vec<f64>>, m: usize, n: usize, k: usize, gelu: bool) -> Vec<f64> {
    let out = |v: f64| if gelu { Activation::GeluTanh.apply_f64(v) } else { v };
    let b = |j: usize| bias.map_or(0.0, |b| b[j]);
    (0..m * n).map(|i| out((0..k).map(|c| x[i / n * k + c] * w[i % n * k + c]).sum::<f64>() + b(i % n))).collect()
}

/// The gated projection: `act(x · w_gate) · (x · w_up)`, the gate rows first.
fn gate_up(x: &[f64], w: &[f64], rows: usize, n: usize, k: usize, act: Activation) -> Vec<f64> {
    let dot = |r: usize, j: usize| (0..k).map(|c| x[r * k + c] * w[j * k + c]).sum::<f64>();
    (0..rows * n).map(|i| act.apply_f64(dot(i / n, i % n)) * dot(i / n, n + i % n)).collect()
}

/// Each row's softmax over its experts, kept for the `top_k` largest logits (ties
/// to the lower index), renormalised over them when `norm`.
pub fn moe_route(logits: &[f64], rows: usize, experts: usize, top_k: usize, norm: bool) -> Vec<f64> {
    let mut out = vec![0.0; rows * experts];
    for (l, o) in logits.chunks(experts).zip(out.chunks_mut(experts)).take(rows) {
        let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = l.iter().map(|v| (v - m).exp()).sum();
        let mut order: Vec<usize> = (0..experts).collect();
        order.sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
        let kept = &order[..top_k.min(experts)];
        let sum: f64 = kept.iter().map(|&e| (l[e] - m).exp()).sum();
        for &e in kept {
            o[e] = (l[e] - m).exp() / if norm { sum } else { z };
        }
    }
    out
}

/// The experts of a route row, ascending: its slots.
fn slots(route: &[f64]) -> Vec<usize> {
    (0..route.len()).filter(|&e| route[e] != 0.0).collect()
}

fn moe_gate_up(ins: &[Vec<f64>], rows: usize, experts: usize, top_k: usize, n: usize, k: usize, act: Activation) -> Vec<f64> {
    let (x, route, w) = (&ins[0], &ins[1], &ins[2]);
    let dot = |t: usize, r: usize| (0..k).map(|c| x[t * k + c] * w[r * k + c]).sum::<f64>();
    let mut h = vec![0.0; rows * top_k * n];
    for t in 0..rows {
        for (j, e) in slots(&route[t * experts..][..experts]).into_iter().take(top_k).enumerate() {
            for f in 0..n {
                h[(t * top_k + j) * n + f] = act.apply_f64(dot(t, e * n + f)) * dot(t, (experts + e) * n + f);
            }
        }
    }
    h
}

fn moe_down(ins: &[Vec<f64>], rows: usize, experts: usize, top_k: usize, n: usize, k: usize) -> Vec<f64> {
    let (h, route, w) = (&ins[0], &ins[1], &ins[2]);
    let mut y = vec![0.0; rows * n];
    for t in 0..rows {
        let r = &route[t * experts..][..experts];
        for (j, e) in slots(r).into_iter().take(top_k).enumerate() {
            let hj = &h[(t * top_k + j) * k..][..k];
            for f in 0..n {
                y[t * n + f] += r[e] * (0..k).map(|c| hj[c] * w[(e * n + f) * k + c]).sum::<f64>();
            }
        }
    }
    y
}

/// The RMSNorm-prologue GEMV: the residual (none, added, or added after its own
/// norm), RMSNorm, then a plain or gated projection; the residual sum too when
/// there is one.
fn norm_gemv(
    ins: &[Vec<f64>],
    n: usize,
    k: usize,
    eps: f64,
    unit_offset: bool,
    residual: NormResidual,
    act: Option<Activation>,
) -> Vec<Vec<f64>> {
    let x = &ins[0][..k];
    let (h, rest): (Vec<f64>, &[Vec<f64>]) = match residual {
        NormResidual::None => (x.to_vec(), &ins[1..]),
        NormResidual::Add => (add(x, &ins[1]), &ins[2..]),
        NormResidual::Normed => (add(x, &rms_row(&ins[1][..k], &ins[2][..k], eps, unit_offset)), &ins[3..]),
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

/// The vision tower's attention: every query sees every key (causal attention of
/// the last query over all keys, once per query, with the keys in the cache
/// layout).
fn attention_full(ins: &[Vec<f64>], tokens: usize, heads: usize, d: usize, scale: f64) -> Vec<f64> {
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
        out.extend(attention(q, &kc, &vc, 1, tokens - 1, tokens, heads, heads, d, 0, scale, (0, 0)));
    }
    out
}

/// RMSNorm of each of `rows` rows of `dim`.
fn rms_rows(x: &[f64], w: &[f64], rows: usize, dim: usize, eps: f64, unit: bool) -> Vec<f64> {
    (0..rows).flat_map(|r| rms_row(&x[r * dim..][..dim], w, eps, unit)).collect()
}

/// LayerNorm (gain `w`, bias `b`) of each of `rows` rows of `dim`.
fn layer_rows(x: &[f64], w: &[f64], b: &[f64], rows: usize, dim: usize, eps: f64) -> Vec<f64> {
    let mut y = Vec::with_capacity(rows * dim);
    for r in 0..rows {
        let x = &x[r * dim..][..dim];
        let mean = x.iter().sum::<f64>() / dim as f64;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / dim as f64;
        let rs = 1.0 / (var + eps).sqrt();
        y.extend((0..dim).map(|c| (x[c] - mean) * rs * w[c] + b[c]));
    }
    y
}

/// Softmax of each of `rows` rows of `dim`.
fn softmax_rows(x: &[f64], rows: usize, dim: usize) -> Vec<f64> {
    let mut y = Vec::with_capacity(rows * dim);
    for r in 0..rows {
        let x = &x[r * dim..][..dim];
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = x.iter().map(|v| (v - m).exp()).sum();
        y.extend(x.iter().map(|v| (v - m).exp() / z));
    }
    y
}

/// Where and how the fused KV-cache write rotates (and first normalizes) a head.
struct RopeAt {
    pos0: usize,
    layout: RopeLayout,
    eps: f64,
    unit_offset: bool,
}

/// The fused QKV RoPE + cache write: q rotated (normed first with `norm`), k the
/// same into its cache row at `pos0`, v copied into its; the caches hold
/// [`SENTINEL`] elsewhere.
fn qkv_rope_cache(ins: &[Vec<f64>], heads: usize, kv_heads: usize, d: usize, kv_cap: usize, norm: bool, at: RopeAt) -> Vec<Vec<f64>> {
    let (qkv, gains, freq) = if norm { (&ins[0], Some((&ins[1], &ins[2])), &ins[3]) } else { (&ins[0], None, &ins[1]) };
    let head = |r: usize, g: Option<&Vec<f64>>| {
        let x = &qkv[r * d..][..d];
        let mut v = match g {
            Some(g) => rms_row(x, g, at.eps, at.unit_offset),
            None => x.to_vec(),
        };
        rope_head(&mut v, freq, at.pos0 as f64, at.layout);
        v
    };
    let q: Vec<f64> = (0..heads).flat_map(|h| head(h, gains.map(|g| g.0))).collect();
    let mut kc = vec![SENTINEL as f64; kv_heads * kv_cap * d];
    let mut vc = kc.clone();
    for h in 0..kv_heads {
        let row = (h * kv_cap + at.pos0) * d;
        kc[row..row + d].copy_from_slice(&head(heads + h, gains.map(|g| g.1)));
        vc[row..row + d].copy_from_slice(&qkv[(heads + kv_heads + h) * d..][..d]);
    }
    vec![q, kc, vc]
}

/// The vision tower's patch embedding: each `patch` x `patch` patch of every
/// channel of the `image` x `image` pixels, projected to `hidden` (+ bias).
fn patch_embed(ins: &[Vec<f64>], channels: usize, image: usize, patch: usize, hidden: usize) -> Vec<f64> {
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
    y
}

/// The mean of each `kernel` x `kernel` window of a `side` x `side` grid of
/// `dim`-vectors.
fn avg_pool(x: &[f64], side: usize, kernel: usize, dim: usize) -> Vec<f64> {
    let out = side / kernel;
    let mut y = vec![0.0; out * out * dim];
    for oy in 0..out {
        for ox in 0..out {
            for c in 0..dim {
                let mut s = 0.0;
                for ky in 0..kernel {
                    for kx in 0..kernel {
                        s += x[((oy * kernel + ky) * side + ox * kernel + kx) * dim + c];
                    }
                }
                y[(oy * out + ox) * dim + c] = s / (kernel * kernel) as f64;
            }
        }
    }
    y
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
