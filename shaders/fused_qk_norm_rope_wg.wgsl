// Fused per-head RMSNorm + RoPE (Gemma 3's q/k norm): one workgroup per (token, head).
// Every invocation accumulates x² over a stride of the head, the workgroup reduces
// the partial sums through workgroup memory, then each invocation normalizes and
// rotates whole pairs (i, i + rot/2) or (2i, 2i + 1), so both elements of a pair are
// read and written by the same invocation; dims past rot_dim are only normalized.
// Any head_dim; the norm weight is read as u32 words decoded by W_F16.

override WG: u32 = 64;
override W_F16: bool = false;

struct Dims {
    tokens: u32,
    heads: u32,
    head_dim: u32,
    rot_half: u32,
    pos0: u32,
    interleaved: u32, // 0 rotate-half pairs (i, i + rot/2), 1 interleaved (2i, 2i + 1)
    eps: f32,
    unit_offset: u32, // 1: scale by (1 + w) (Gemma)
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> inv_freq: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, WG>;

fn wload(i: u32) -> f32 {
    if (W_F16) {
        let pair = unpack2x16float(w[i >> 1u]);
        return select(pair.x, pair.y, (i & 1u) == 1u);
    }
    return bitcast<f32>(w[i]);
}

fn gain(i: u32) -> f32 {
    let g = wload(i);
    return select(g, 1.0 + g, dims.unit_offset != 0u);
}

// cos and sin of pos * f, accurate at far positions: pos and f are split into 12-bit
// halves so the four partial products are exact in f32, each is reduced by 2pi in
// three parts (Cody-Waite, 2pi head 6.28125 exact in 8 bits), and only then do the
// hardware cos/sin run (accurate near zero only on many GPUs). Exact for positions
// below 500000 (checked on the host) and f <= 1, as in rope_pair.wgsl.
const INV_TAU: f32 = 0.15915494309189535;
const TAU_HI: f32 = 6.28125;
const TAU_MID: f32 = 0.0019353071693331003;
const TAU_LO: f32 = 1.0253131677018246e-11;

fn reduce(t: f32) -> f32 {
    let k = round(t * INV_TAU);
    return ((t - k * TAU_HI) - k * TAU_MID) - k * TAU_LO;
}

fn rope_cs(pos: u32, f: f32) -> vec2<f32> {
    let fh = bitcast<f32>(bitcast<u32>(f) & 0xfffff000u);
    let fl = f - fh;
    let ph = f32(pos & 0xfffff000u);
    let pl = f32(pos & 0xfffu);
    let r = reduce(reduce(ph * fh) + reduce(ph * fl) + reduce(pl * fh) + reduce(pl * fl));
    return vec2<f32>(cos(r), sin(r));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let head = wid.x + wid.y * nwg.x; // token * heads + h
    if (head >= dims.tokens * dims.heads) {
        return;
    }
    let d = dims.head_dim;
    let base = head * d;
    var ss = 0.0;
    for (var c = tid; c < d; c += WG) {
        let v = x[base + c];
        ss += v * v;
    }
    partial[tid] = ss;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            partial[tid] += partial[tid + s];
        }
        workgroupBarrier();
    }
    let inv = inverseSqrt(partial[0] / f32(d) + dims.eps);
    let pos = dims.pos0 + head / dims.heads;
    let half = dims.rot_half;
    for (var i = tid; i < half; i += WG) {
        var a = i;
        var b = i + half;
        if (dims.interleaved == 1u) {
            a = 2u * i;
            b = a + 1u;
        }
        let x0 = x[base + a] * inv * gain(a);
        let x1 = x[base + b] * inv * gain(b);
        let cs = rope_cs(pos, inv_freq[i]);
        y[base + a] = x0 * cs.x - x1 * cs.y;
        y[base + b] = x1 * cs.x + x0 * cs.y;
    }
    for (var c = 2u * half + tid; c < d; c += WG) {
        y[base + c] = x[base + c] * inv * gain(c);
    }
}
