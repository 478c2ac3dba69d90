// Row softmax in three passes, one workgroup per row: (1) the row maximum, reduced
// through workgroup memory; (2) the sum of exp(x - max), reduced the same way;
// (3) y = exp(x - max) / sum. The row is read three times (from cache after the
// first) and the max is exact before any exponential is taken.
// Includes: elementwise_softmax.wgsl (interface, row pieces), row_wg.wgsl (entry
// point), reduce_wg.wgsl (the trees).

override WG: u32 = 128;

var<workgroup> partial: array<f32, WG>;

fn run_row(row: u32, tid: u32, stride: u32) {
    let d = dims.dim;
    let base = row * d;
    var m = NEG;
    for (var c = tid; c < d; c += stride) {
        m = max(m, x[base + c]);
    }
    let mx = row_max(m, tid);
    workgroupBarrier();
    var sum = 0.0;
    for (var c = tid; c < d; c += stride) {
        sum += exp(x[base + c] - mx);
    }
    softmax_write(base, tid, stride, d, mx, 1.0 / row_sum(sum, tid));
}
