// Fused residual add + LayerNorm with one workgroup per row and a single pass for
// h and the statistics: every invocation strides over the row writing h = x + r
// and running Welford's update (count, mean, M2) over the values it wrote; the
// workgroup merges the WG triples pairwise in a tree (Chan et al.), as
// norm_layer_wg.wgsl, then every invocation rereads its own h and writes y.
// Includes: fused_residual_layer_norm.wgsl (interface, output pass), row_wg.wgsl
// (entry point), wload.wgsl.

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
        let v = x[base + c] + r[base + c];
        h[base + c] = v;
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
