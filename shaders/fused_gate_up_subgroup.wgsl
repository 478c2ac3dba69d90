// Fused gate+up projection with subgroup reductions and 16-byte loads:
// y[t, j] = act(x[t]·w[j]) * (x[t]·w[n + j]). Each workgroup owns ROWS features of
// one token row (grid z = t), spread over its subgroups; a subgroup streams the gate
// row and the up row of its feature together (one x load feeds both), finishes each
// with one subgroupAdd and lane 0 applies the activation product. No workgroup
// memory, no barriers. Needs SUBGROUP and k % 4 == 0 (f32) or k % 8 == 0 (f16).

override WG: u32 = 128;
override ROWS: u32 = 4;
override W_F16: bool = false;

struct Dims { n: u32, k: u32, act: u32 } // act: 0 silu, 1 gelu_tanh

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

fn h2(v: u32) -> vec2<f32> { return unpack2x16float(v); }

fn act(g: f32) -> f32 {
    if (dims.act == 1u) {
        let t = tanh(clamp(0.7978845608028654 * (g + 0.044715 * g * g * g), -15.0, 15.0));
        return 0.5 * g * (1.0 + t);
    }
    return g / (1.0 + exp(-g));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let j0 = (wid.x + wid.y * nwg.x) * ROWS;
    let t = wid.z;
    let n = dims.n;
    let k = dims.k;
    let xv0 = t * (k / 4u); // first vec4 of x row t
    for (var r = sg; r < ROWS; r += nsg) {
        let j = j0 + r;
        if (j >= n) { break; }
        var g = 0.0;
        var u = 0.0;
        if (W_F16) {
            let words = k / 8u;
            let gb = j * words;
            let ub = (n + j) * words;
            for (var c = lane; c < words; c += sg_size) {
                let xa = x[xv0 + 2u * c];
                let xb = x[xv0 + 2u * c + 1u];
                let qg = w[gb + c];
                let qu = w[ub + c];
                g += dot(xa, vec4<f32>(h2(qg.x), h2(qg.y))) + dot(xb, vec4<f32>(h2(qg.z), h2(qg.w)));
                u += dot(xa, vec4<f32>(h2(qu.x), h2(qu.y))) + dot(xb, vec4<f32>(h2(qu.z), h2(qu.w)));
            }
        } else {
            let vecs = k / 4u;
            let gb = j * vecs;
            let ub = (n + j) * vecs;
            for (var c = lane; c < vecs; c += sg_size) {
                let xv = x[xv0 + c];
                g += dot(xv, bitcast<vec4<f32>>(w[gb + c]));
                u += dot(xv, bitcast<vec4<f32>>(w[ub + c]));
            }
        }
        let gs = subgroupAdd(g);
        let us = subgroupAdd(u);
        if (lane == 0u) {
            y[t * n + j] = act(gs) * us;
        }
    }
}
