// Fused gate+up projection with subgroup reductions and 16-byte loads:
// y[t, j] = act(x[t]·w[j]) * (x[t]·w[n + j]). Each workgroup owns ROWS features of
// one token row (grid z = t), spread over its subgroups; a subgroup streams the gate
// row and the up row of its feature together (one x load feeds both), finishes each
// with one subgroupAdd and lane 0 applies the activation product. No workgroup
// memory, no barriers. Needs SUBGROUP and k % 4 == 0 (f32) or k % 8 == 0 (f16).
// Includes: act.wgsl, wload.wgsl (W_F16, 16-byte words).
// Requires: grid_sg.wgsl, grid.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override W_F16: bool = false;

struct Dims { n: u32, k: u32, act: u32 } // act: 0 silu, 1 gelu_tanh

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

@compute @workgroup_size(WG)
fn main(s: SgGrid) {
    let j0 = wg_linear(s.wid, s.nwg) * ROWS;
    let t = s.wid.z;
    let n = dims.n;
    let k = dims.k;
    let xv0 = t * (k / 4u); // first vec4 of x row t
    let words = wwords16(k);
    for (var r = s.sg; r < ROWS; r += s.nsg) {
        let j = j0 + r;
        if (j >= n) { break; }
        var g = 0.0;
        var u = 0.0;
        let gb = j * words;
        let ub = (n + j) * words;
        for (var c = s.lane; c < words; c += s.sg_size) {
            let xi = xv0 + wx16(c);
            let xa = x[xi.x];
            let xb = x[xi.y];
            g += wdot16(w[gb + c], xa, xb);
            u += wdot16(w[ub + c], xa, xb);
        }
        let gs = subgroupAdd(g);
        let us = subgroupAdd(u);
        if (s.lane == 0u) {
            y[t * n + j] = act(gs, dims.act == 1u) * us;
        }
    }
}
