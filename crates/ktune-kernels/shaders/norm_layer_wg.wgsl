// LayerNorm with one workgroup per row and a single read of x for the statistics:
// every invocation runs Welford's update over its WG-strided elements (count, mean,
// M2), and the workgroup merges the WG triples pairwise in a tree (Chan et al.:
// M2 = M2a + M2b + delta² na nb / n), which stays accurate when |mean| >> std, unlike
// sum and sum of squares.
// The row's values come from the interface's ln_read (x, or for the fused
// residual form h = x + r, written as it is read).
// Includes: norm_layer.wgsl or fused_residual_layer_norm.wgsl (interface),
// layer_write.wgsl (output pass), row_wg.wgsl (entry point), wload.wgsl.

override WG: u32 = 128;
override W_F16: bool = false;

var<workgroup> pn: array<f32, WG>;
var<workgroup> pmean: array<f32, WG>;
var<workgroup> pm2: array<f32, WG>;

fn run_row(row: u32, tid: u32, stride: u32) {
    let d = dims.dim;
    let base = row * d;
    var n = 0.0;
    var mean = 0.0;
    var m2 = 0.0;
    for (var c = tid; c < d; c += stride) {
        let v = ln_read(base + c);
        n += 1.0;
        let delta = v - mean;
        mean += delta / n;
        m2 += delta * (v - mean);
    }
    pn[tid] = n;
    pmean[tid] = mean;
    pm2[tid] = m2;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            let nb = pn[tid + s];
            if (nb > 0.0) {
                let na = pn[tid];
                let nt = na + nb;
                let delta = pmean[tid + s] - pmean[tid];
                pmean[tid] += delta * (nb / nt);
                pm2[tid] += pm2[tid + s] + delta * delta * (na * nb / nt);
                pn[tid] = nt;
            }
        }
        workgroupBarrier();
    }
    layer_write(base, tid, stride, pmean[0], inverseSqrt(pm2[0] / f32(d) + dims.eps));
}
