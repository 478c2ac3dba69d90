// Row softmax with the max and the sum fused into one pass (online softmax), one
// workgroup per row: every invocation keeps a running (max m, sum s) over its
// strided elements, rescaling s when m grows; the WG pairs are merged through
// workgroup memory with (m, s) + (m', s') = (M, s e^(m-M) + s' e^(m'-M)); a second
// pass writes y = exp(x - M) / S. Two reads of the row instead of three.
// Includes: elementwise_softmax.wgsl (interface, row pieces), row_wg.wgsl (entry
// point).

override WG: u32 = 128;

var<workgroup> pm: array<f32, WG>;
var<workgroup> ps: array<f32, WG>;

fn run_row(row: u32, tid: u32, stride: u32) {
    let base = row * dims.dim;
    let ms = online_row(base, tid, stride, dims.dim);
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
    softmax_write(base, tid, stride, dims.dim, pm[0], 1.0 / ps[0]);
}
