// Fused RMSNorm prologue + quantized GEMV (decode) reduced with subgroup
// operations: y[n] = w[n,k] · (x * inv_rms * g'), w in ggml blocks (QFMT selects
// q8_0 / q4_0 / q4_1) dequantized in registers, g' = g or 1 + g (unit_offset,
// Gemma), inv_rms = 1 / sqrt(mean(x²) + eps). Every subgroup first sums x² over k
// itself (k floats from cache, one subgroupAdd), then owns whole rows (sg,
// sg + num_subgroups, ... of the workgroup's ROWS): its lanes stride over the row's
// quant words, dot them with x·g', and one subgroupAdd finishes the row, scaled by
// inv_rms; no workgroup memory, no barriers. Needs SUBGROUP and k a whole number of blocks (qbe()).
//
// The decode chain's forms, as norm_gemv_subgroup.wgsl: the input x + r (residual
// 1) or x + rmsnorm(r) * g_r' (2), written once to h by the first subgroup of the
// first workgroup; with an activation the weight is the fused gate/up [2n, k] and
// y[r] = act(gate) * up. Without them the host binds x, g and y in place of r, g_r
// and h (never read or written).
// Includes: norm_gemv_q.wgsl (interface), qblock.wgsl (block decoding), act.wgsl.
// Requires: grid_sg.wgsl, grid.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override QFMT: u32 = 0u;

@group(0) @binding(6) var<storage, read> r: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read> g_r: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read_write> h: array<f32>;

// Elements 4i..4i+4 of the prologue's input (x, x + r, or x + r * inv_r * g_r').
fn xin(i: u32, inv_r: f32) -> vec4<f32> {
    switch dims.residual {
        case 0u: { return x[i]; }
        case 1u: { return x[i] + r[i]; }
        default: { return x[i] + r[i] * inv_r * (g_r[i] + vec4<f32>(select(0.0, 1.0, dims.unit_offset != 0u))); }
    }
}

@compute @workgroup_size(WG)
fn main(s: SgGrid) {
    let first = wg_linear(s.wid, s.nwg);
    let row0 = first * ROWS;
    let qu = qunits();
    let wpr = dims.k / qbe() * qu;
    let vecs = dims.k / 4u;
    var inv_r = 0.0;
    if (dims.residual == 2u) {
        var sr = 0.0;
        for (var c = s.lane; c < vecs; c += s.sg_size) {
            let v = r[c];
            sr += dot(v, v);
        }
        inv_r = inverseSqrt(subgroupAdd(sr) / f32(dims.k) + dims.eps);
    }
    var ss = 0.0;
    for (var c = s.lane; c < vecs; c += s.sg_size) {
        let v = xin(c, inv_r);
        ss += dot(v, v);
    }
    let inv = inverseSqrt(subgroupAdd(ss) / f32(dims.k) + dims.eps);
    if (dims.residual != 0u && first == 0u && s.sg == 0u) {
        for (var c = s.lane; c < vecs; c += s.sg_size) {
            let v = xin(c, inv_r);
            for (var e = 0u; e < 4u; e++) {
                h[4u * c + e] = v[e];
            }
        }
    }
    let off = vec4<f32>(select(0.0, 1.0, dims.unit_offset != 0u));
    let gated = dims.act != 0u;
    for (var rr = s.sg; rr < ROWS; rr += s.nsg) {
        let row = row0 + rr;
        if (row >= dims.n) { break; }
        var acc = 0.0;
        var acc_up = 0.0;
        for (var wi = s.lane; wi < wpr; wi += s.sg_size) {
            // Unit j of block bi covers x at qpos(j) within the block (two halves but for q8_0).
            let base = (wi / qu) * (qbe() / 4u);
            let p = qpos(wi % qu);
            let i0 = base + p.x / 4u;
            let i1 = base + p.y / 4u;
            let a0 = xin(i0, inv_r) * (g[i0] + off);
            let d = qdecode(row * wpr + wi);
            acc += dot(d.lo, a0);
            var a1 = vec4<f32>(0.0);
            if (QFMT != 0u) {
                a1 = xin(i1, inv_r) * (g[i1] + off);
                acc += dot(d.hi, a1);
            }
            if (gated) {
                let du = qdecode((row + dims.n) * wpr + wi);
                acc_up += dot(du.lo, a0);
                if (QFMT != 0u) {
                    acc_up += dot(du.hi, a1);
                }
            }
        }
        let total = subgroupAdd(acc) * inv;
        let up = subgroupAdd(acc_up) * inv;
        if (s.lane == 0u) {
            y[row] = select(total, act(total, dims.act == 2u) * up, gated);
        }
    }
}
