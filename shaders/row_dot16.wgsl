// One lane's share of a row's dot product for the subgroup kernels that read the
// weights as 16-byte words (`shader!(FILE, .., "row_dot16.wgsl", "wload.wgsl", ..)`:
// gemv_subgroup, fused_qkv_proj_subgroup): the words c = lane, lane + stride, .. of
// row `row` of the shader's `w` (vec4<u32>, `dims.k` weights a row) times the
// activations of the shader's `x` (vec4<f32>) they multiply; the caller reduces the
// lanes (row_sum).

fn row_dot16(row: u32, lane: u32, stride: u32) -> f32 {
    let words = wwords16(dims.k);
    var acc = 0.0;
    for (var c = lane; c < words; c += stride) {
        let xi = wx16(c);
        acc += wdot16(w[row * words + c], x[xi.x], x[xi.y]);
    }
    return acc;
}
