// Fused residual add + LayerNorm with one subgroup per row and exact two-pass
// statistics: a subgroup streams its row writing h = x + r and summing it
// (subgroupAdd) for the mean, rereads its own h for the centred sum of squares
// (subgroupAdd), then writes y = (h - mean) * rsqrt(var + eps) * w + b. ROWS rows
// per workgroup spread over its subgroups; no workgroup memory, no barriers.
// Needs SUBGROUP and a workgroup at least one subgroup wide.
// Includes: fused_residual_layer_norm.wgsl (interface, output pass), row_sg.wgsl
// (entry point), reduce_sg.wgsl, wload.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override W_F16: bool = false;

fn run_row(row: u32, lane: u32, stride: u32) {
    let d = dims.dim;
    let base = row * d;
    var sum = 0.0;
    for (var c = lane; c < d; c += stride) {
        let v = x[base + c] + r[base + c];
        h[base + c] = v;
        sum += v;
    }
    let mean = row_sum(sum, lane) / f32(d);
    var sq = 0.0;
    for (var c = lane; c < d; c += stride) {
        let t = h[base + c] - mean;
        sq += t * t;
    }
    layer_write(base, lane, stride, mean, inverseSqrt(row_sum(sq, lane) / f32(d) + dims.eps));
}
