// Fused RMSNorm prologue + GEMV (decode), reduced with subgroup operations:
// y[n] = w[n,k] · (x * inv_rms * g'), g' = g or 1 + g (unit_offset, Gemma),
// inv_rms = 1 / sqrt(mean(x²) + eps). Every subgroup first sums x² over k itself
// (k floats from cache, one subgroupAdd: no workgroup memory, no barrier), then owns
// whole rows (sg, sg + num_subgroups, ... of the workgroup's ROWS): its lanes load
// 16 bytes of the row per step, dot them with x·g', and one subgroupAdd finishes the
// row, scaled by inv_rms. The gain and the weights are vec4<u32> words decoded by
// W_F16 (4 f32 or 8 packed f16). Needs SUBGROUP and k % 4 == 0 (f32) or k % 8 == 0 (f16).
//
// The decode chain's forms (dims.residual, dims.act): the input is x + r
// (residual 1) or x + rmsnorm(r) * g_r' (2: Gemma's post-norms; each subgroup sums
// r² itself first), recomputed where read and written once to h by the first
// subgroup of the first workgroup (no other workgroup reads h); with an activation
// (1 + Activation::code) the weight is the fused gate/up [2n, k] and each row r
// dots rows r and n + r: y[r] = act(gate) * up. Without them the host binds x, g
// and y in place of r, g_r and h (never read or written).
// Includes: wload.wgsl (W_F16, 16-byte words), act.wgsl.
// Requires: grid_sg.wgsl, grid.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override W_F16: bool = false;

struct Dims { n: u32, k: u32, eps: f32, unit_offset: u32, residual: u32, act: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> g: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;
@group(0) @binding(5) var<storage, read> r: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> g_r: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> h: array<f32>;

// Elements 4i..4i+4 of the residual's gain g_r, as applied.
fn gain_r4(i: u32) -> vec4<f32> {
    var v: vec4<f32>;
    if (W_F16) {
        let q = g_r[i / 2u];
        v = select(wlo4(q), whi4(q), (i & 1u) == 1u);
    } else {
        v = wlo4(g_r[i]);
    }
    return v + vec4<f32>(select(0.0, 1.0, dims.unit_offset != 0u));
}

// Elements 4i..4i+4 of the prologue's input (x, x + r, or x + r * inv_r * g_r').
fn xin(i: u32, inv_r: f32) -> vec4<f32> {
    switch dims.residual {
        case 0u: { return x[i]; }
        case 1u: { return x[i] + r[i]; }
        default: { return x[i] + r[i] * inv_r * gain_r4(i); }
    }
}

@compute @workgroup_size(WG)
fn main(s: SgGrid) {
    let first = wg_linear(s.wid, s.nwg);
    let row0 = first * ROWS;
    let k = dims.k;
    let vecs = k / 4u;
    var inv_r = 0.0;
    if (dims.residual == 2u) {
        var sr = 0.0;
        for (var c = s.lane; c < vecs; c += s.sg_size) {
            let v = r[c];
            sr += dot(v, v);
        }
        inv_r = inverseSqrt(subgroupAdd(sr) / f32(k) + dims.eps);
    }
    var ss = 0.0;
    for (var c = s.lane; c < vecs; c += s.sg_size) {
        let v = xin(c, inv_r);
        ss += dot(v, v);
    }
    let inv = inverseSqrt(subgroupAdd(ss) / f32(k) + dims.eps);
    if (dims.residual != 0u && first == 0u && s.sg == 0u) {
        for (var c = s.lane; c < vecs; c += s.sg_size) {
            let v = xin(c, inv_r);
            for (var e = 0u; e < 4u; e++) {
                h[4u * c + e] = v[e];
            }
        }
    }
    let off = vec4<f32>(select(0.0, 1.0, dims.unit_offset != 0u));
    let words = wwords16(k);
    let gated = dims.act != 0u;
    for (var rr = s.sg; rr < ROWS; rr += s.nsg) {
        let row = row0 + rr;
        if (row >= dims.n) { break; }
        var acc = 0.0;
        var acc_up = 0.0;
        for (var c = s.lane; c < words; c += s.sg_size) {
            let xi = wx16(c);
            let gq = g[c];
            let a0 = xin(xi.x, inv_r) * (wlo4(gq) + off);
            let a1 = xin(xi.y, inv_r) * (whi4(gq) + off);
            acc += wdot16(w[row * words + c], a0, a1);
            if (gated) {
                acc_up += wdot16(w[(row + dims.n) * words + c], a0, a1);
            }
        }
        let total = subgroupAdd(acc) * inv;
        let up = subgroupAdd(acc_up) * inv;
        if (s.lane == 0u) {
            y[row] = select(total, act(total, dims.act == 2u) * up, gated);
        }
    }
}
