// Fused gate+up projection, GEMV style: y[t, j] = act(x[t]·w[j]) * (x[t]·w[n + j]).
// Each workgroup owns ROWS consecutive features j of one token row t (grid z = t):
// every invocation strides over k and accumulates the gate and the up dot products
// of all ROWS features from one load of x, the workgroup reduces the 2·ROWS partials
// through workgroup memory and the first ROWS invocations apply the activation
// product. Any k; weights as u32 words decoded by W_F16 (f32 bits or f16 pairs).
// Includes: act.wgsl, reduce_wg.wgsl (the tree), wload.wgsl (W_F16).

override WG: u32 = 128;
override ROWS: u32 = 2;
override W_F16: bool = false;

struct Dims { n: u32, k: u32, act: u32 } // act: 0 silu, 1 gelu_tanh

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, 2u * WG * ROWS>;

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let j0 = (wid.x + wid.y * nwg.x) * ROWS;
    let t = wid.z;
    let n = dims.n;
    let k = dims.k;
    let xb = t * k;
    var acc: array<f32, 8>; // 2 * ROWS <= 8 (checked on the host)
    for (var r = 0u; r < 2u * ROWS; r++) { acc[r] = 0.0; }
    for (var c = tid; c < k; c += WG) {
        let xv = x[xb + c];
        for (var r = 0u; r < ROWS; r++) {
            let j = min(j0 + r, n - 1u);
            acc[2u * r] += xv * wload(j * k + c);
            acc[2u * r + 1u] += xv * wload((n + j) * k + c);
        }
    }
    for (var r = 0u; r < 2u * ROWS; r++) { partial[r * WG + tid] = acc[r]; }
    wg_sum_rows(tid, 2u * ROWS);
    if (tid < ROWS && j0 + tid < n) {
        let g = partial[(2u * tid) * WG];
        let u = partial[(2u * tid + 1u) * WG];
        y[t * n + j0 + tid] = act(g, dims.act == 1u) * u;
    }
}
