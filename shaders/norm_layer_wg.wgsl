// LayerNorm y = (x - mean) / sqrt(var + eps) * w + b with one workgroup per row and
// a single read of x for the statistics: every invocation runs Welford's update
// over its WG-strided elements (count, mean, M2), and the workgroup merges the WG
// triples pairwise in a tree (Chan et al.: M2 = M2a + M2b + delta² na nb / n), which
// stays accurate when |mean| >> std, unlike sum and sum of squares. Any dim; w and
// b are read as u32 words decoded by W_F16 (wload.wgsl).

override WG: u32 = 128;

struct Dims { rows: u32, dim: u32, eps: f32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

var<workgroup> pn: array<f32, WG>;
var<workgroup> pmean: array<f32, WG>;
var<workgroup> pm2: array<f32, WG>;

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }
fn bload(i: u32) -> f32 { return wpick(b[wword(i)], i); }

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= dims.rows) {
        return;
    }
    let d = dims.dim;
    let base = row * d;
    var n = 0.0;
    var mean = 0.0;
    var m2 = 0.0;
    for (var c = tid; c < d; c += WG) {
        let v = x[base + c];
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
    let row_mean = pmean[0];
    let rs = inverseSqrt(pm2[0] / f32(d) + dims.eps);
    for (var c = tid; c < d; c += WG) {
        y[base + c] = (x[base + c] - row_mean) * rs * wload(c) + bload(c);
    }
}
