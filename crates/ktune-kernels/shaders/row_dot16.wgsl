// One lane's share of a row's dot product for the subgroup kernels that read the
// weights as 16-byte words (`shader!(FILE, .., "row_dot16.wgsl", "wload.wgsl", ..)`:
// gemv_subgroup, fused_qkv_proj_subgroup): the words c = lane, lane + stride, .. of
// row `row` of the shader's `w` (vec4<u32>, `dims.k` weights a row) times the
// activations of the shader's `x` (vec4<f32>) they multiply; the caller reduces the
// lanes (row_sum). The including shader's `override UNROLL: u32` (1, 2 or 4) words
// of a lane are loaded, with their activations, before any is used (a loop of
// constant trip count: UNROLL loads in flight per lane rather than one per step);
// the words past the last whole round go one at a time.

fn row_dot16(row: u32, lane: u32, stride: u32) -> f32 {
    let words = wwords16(dims.k);
    let round = stride * UNROLL;
    let full = words / round * round;
    var acc = 0.0;
    for (var c0 = lane; c0 < full; c0 += round) {
        var wv: array<vec4<u32>, 4>;
        var xa: array<vec4<f32>, 4>;
        var xb: array<vec4<f32>, 4>;
        for (var u = 0u; u < UNROLL; u++) {
            let c = c0 + u * stride;
            let xi = wx16(c);
            wv[u] = w[row * words + c];
            xa[u] = x[xi.x];
            xb[u] = x[xi.y];
        }
        for (var u = 0u; u < UNROLL; u++) {
            acc += wdot16(wv[u], xa[u], xb[u]);
        }
    }
    for (var c = full + lane; c < words; c += stride) {
        let xi = wx16(c);
        acc += wdot16(w[row * words + c], x[xi.x], x[xi.y]);
    }
    return acc;
}
