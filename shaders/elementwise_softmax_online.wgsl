// Row softmax with the max and the sum fused into one pass (online softmax), one
// workgroup per row: every invocation keeps a running (max m, sum s) over its
// strided elements, rescaling s when m grows; the WG pairs are merged through
// workgroup memory with (m, s) + (m', s') = (M, s e^(m-M) + s' e^(m'-M)); a second
// pass writes y = exp(x - M) / S. Two reads of the row instead of three. Any dim.

override WG: u32 = 128;

struct Dims { rows: u32, dim: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;

var<workgroup> pm: array<f32, WG>;
var<workgroup> ps: array<f32, WG>;

// Finite stand-in for -inf: an empty partial (m = NEG, s = 0) merges as a no-op.
const NEG: f32 = -3.0e38;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= dims.rows) {
        return;
    }
    let d = dims.dim;
    let base = row * d;

    var m = NEG;
    var s = 0.0;
    for (var c = tid; c < d; c += WG) {
        let v = x[base + c];
        if (v > m) {
            s = s * exp(m - v) + 1.0;
            m = v;
        } else {
            s += exp(v - m);
        }
    }
    pm[tid] = m;
    ps[tid] = s;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if (tid < k) {
            let ma = pm[tid];
            let mb = pm[tid + k];
            let mx = max(ma, mb);
            ps[tid] = ps[tid] * exp(ma - mx) + ps[tid + k] * exp(mb - mx);
            pm[tid] = mx;
        }
        workgroupBarrier();
    }
    let row_max = pm[0];
    let inv = 1.0 / ps[0];
    for (var c = tid; c < d; c += WG) {
        y[base + c] = exp(x[base + c] - row_max) * inv;
    }
}
