// Row softmax in three passes, one workgroup per row: (1) the row maximum, reduced
// through workgroup memory; (2) the sum of exp(x - max), reduced the same way;
// (3) y = exp(x - max) / sum. The row is read three times (from cache after the
// first) and the max is exact before any exponential is taken. Any dim.

override WG: u32 = 128;

struct Dims { rows: u32, dim: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= dims.rows) {
        return;
    }
    let d = dims.dim;
    let base = row * d;

    var m = -3.0e38;
    for (var c = tid; c < d; c += WG) {
        m = max(m, x[base + c]);
    }
    partial[tid] = m;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            partial[tid] = max(partial[tid], partial[tid + s]);
        }
        workgroupBarrier();
    }
    let row_max = partial[0];
    workgroupBarrier();

    var sum = 0.0;
    for (var c = tid; c < d; c += WG) {
        sum += exp(x[base + c] - row_max);
    }
    partial[tid] = sum;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            partial[tid] += partial[tid + s];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / partial[0];

    for (var c = tid; c < d; c += WG) {
        y[base + c] = exp(x[base + c] - row_max) * inv;
    }
}
