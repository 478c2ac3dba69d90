// Row softmax in three passes, one workgroup per row: (1) the row maximum, reduced
// through workgroup memory; (2) the sum of exp(x - max), reduced the same way;
// (3) y = exp(x - max) / sum. The row is read three times (from cache after the
// first) and the max is exact before any exponential is taken. Any dim.
// Includes: softmax.wgsl (row pieces), reduce_wg.wgsl (the trees).

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

    var m = NEG;
    for (var c = tid; c < d; c += WG) {
        m = max(m, x[base + c]);
    }
    let row_max = wg_max(tid, m);
    workgroupBarrier();

    var sum = 0.0;
    for (var c = tid; c < d; c += WG) {
        sum += exp(x[base + c] - row_max);
    }
    let inv = 1.0 / wg_sum(tid, sum);
    softmax_write(base, tid, WG, d, row_max, inv);
}
