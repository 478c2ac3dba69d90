// What the subgroup norm-fused quantized GEMVs share (norm_gemv_q_subgroup and
// its twin over per-operand formats, norm_gemv_qmix_subgroup:
// `shader!(FILE, "norm_gemv_q.wgsl", "norm_gemv_q_sg.wgsl", ..)`): the decode
// chain's bindings (the residual r, its norm's gain g_r, the next residual stream
// h), the prologue's workgroup memory (x·g' by vec4, K4 of them, and one partial
// per subgroup), the gains as applied, and the entry point: the prologue, then
// the workgroup's rows through the including shader's `lane_dots(s, row)`.
// Requires: norm_gemv_sg.wgsl, grid_sg.wgsl, grid.wgsl.

@group(0) @binding(6) var<storage, read> r: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read> g_r: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read_write> h: array<f32>;

// x·g' (the normalized input before its 1 / rms), by vec4.
var<workgroup> xa: array<vec4<f32>, K4>;
var<workgroup> sums: array<f32, WG>;

// The norm's and the residual norm's gains of vec4 c as applied (prologue()).
fn gain(c: u32) -> vec4<f32> {
    return g[c] + vec4<f32>(select(0.0, 1.0, dims.unit_offset != 0u));
}
fn gain_r(c: u32) -> vec4<f32> {
    return g_r[c] + vec4<f32>(select(0.0, 1.0, dims.unit_offset != 0u));
}

@compute @workgroup_size(WG)
fn main(s: SgGrid) {
    let first = wg_linear(s.wid, s.nwg);
    rows(s, first, prologue(s, first));
}
