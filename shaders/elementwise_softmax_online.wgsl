// Row softmax with the max and the sum fused into one pass (online softmax), one
// workgroup per row: every invocation keeps a running (max m, sum s) over its
// strided elements, rescaling s when m grows; the WG pairs are merged through
// workgroup memory with (m, s) + (m', s') = (M, s e^(m-M) + s' e^(m'-M)); a second
// pass writes y = exp(x - M) / S. Two reads of the row instead of three. Any dim.
// Includes: softmax.wgsl (row pieces).

override WG: u32 = 128;

struct Dims { rows: u32, dim: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;

var<workgroup> pm: array<f32, WG>;
var<workgroup> ps: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= dims.rows) {
        return;
    }
    let d = dims.dim;
    let base = row * d;

    let ms = online_row(base, tid, WG, d);
    pm[tid] = ms.x;
    ps[tid] = ms.y;
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
    softmax_write(base, tid, WG, d, pm[0], 1.0 / ps[0]);
}
