// Fused RMSNorm prologue + GEMV (decode), reduced with subgroup operations:
// y[n] = w[n,k] · (x * inv_rms * g'), g' = g or 1 + g (unit_offset, Gemma),
// inv_rms = 1 / sqrt(mean(x²) + eps). Every subgroup first sums x² over k itself
// (k floats from cache, one subgroupAdd: no workgroup memory, no barrier), then owns
// whole rows (sg, sg + num_subgroups, ... of the workgroup's ROWS): its lanes load
// 16 bytes of the row per step, dot them with x·g', and one subgroupAdd finishes the
// row, scaled by inv_rms. The gain and the weights are vec4<u32> words decoded by
// W_F16 (4 f32 or 8 packed f16). Needs SUBGROUP and k % 4 == 0 (f32) or k % 8 == 0 (f16).
// Includes: wload.wgsl (W_F16, 16-byte words).
// Requires: grid_sg.wgsl, grid.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override W_F16: bool = false;

struct Dims { n: u32, k: u32, eps: f32, unit_offset: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> g: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

@compute @workgroup_size(WG)
fn main(s: SgGrid) {
    let row0 = wg_linear(s.wid, s.nwg) * ROWS;
    let k = dims.k;
    let vecs = k / 4u;
    var ss = 0.0;
    for (var c = s.lane; c < vecs; c += s.sg_size) {
        let v = x[c];
        ss += dot(v, v);
    }
    let inv = inverseSqrt(subgroupAdd(ss) / f32(k) + dims.eps);
    let off = vec4<f32>(select(0.0, 1.0, dims.unit_offset != 0u));
    let words = wwords16(k);
    for (var r = s.sg; r < ROWS; r += s.nsg) {
        let row = row0 + r;
        if (row >= dims.n) { break; }
        var acc = 0.0;
        for (var c = s.lane; c < words; c += s.sg_size) {
            let xi = wx16(c);
            let gq = g[c];
            let a0 = x[xi.x] * (wlo4(gq) + off);
            let a1 = x[xi.y] * (whi4(gq) + off);
            acc += wdot16(w[row * words + c], a0, a1);
        }
        let total = subgroupAdd(acc);
        if (s.lane == 0u) {
            y[row] = total * inv;
        }
    }
}
