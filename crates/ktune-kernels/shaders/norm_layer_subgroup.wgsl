// LayerNorm with one subgroup per row and exact two-pass statistics: a subgroup
// sums its row (subgroupAdd) for the mean, rereads it for the centred sum of
// squares (subgroupAdd), then writes y = (x - mean) * rsqrt(var + eps) * w + b.
// ROWS rows per workgroup spread over its subgroups; no workgroup memory, no
// barriers. Needs SUBGROUP and a workgroup at least one subgroup wide.
// The row's values come from the interface's ln_read (first pass) and ln_reread
// (x, or for the fused residual form the h = x + r the first pass wrote).
// Includes: norm_layer.wgsl or fused_residual_layer_norm.wgsl (interface),
// layer_write.wgsl (output pass), row_sg.wgsl (entry point), reduce_sg.wgsl, wload.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override W_F16: bool = false;

fn run_row(row: u32, lane: u32, stride: u32) {
    let d = dims.dim;
    let base = row * d;
    var sum = 0.0;
    for (var c = lane; c < d; c += stride) {
        sum += ln_read(base + c);
    }
    let mean = row_sum(sum, lane) / f32(d);
    var sq = 0.0;
    for (var c = lane; c < d; c += stride) {
        let t = ln_reread(base + c) - mean;
        sq += t * t;
    }
    layer_write(base, lane, stride, mean, inverseSqrt(row_sum(sq, lane) / f32(d) + dims.eps));
}
