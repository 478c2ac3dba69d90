// Fused residual add + RMSNorm with one workgroup per row: every invocation strides
// over the row writing h = x + r and accumulating h², the workgroup reduces through
// workgroup memory, then every invocation rereads the h it wrote itself and writes y.
// Includes: fused_residual_rms_norm.wgsl (interface, row body), row_wg.wgsl (entry
// point), reduce_wg.wgsl (the tree), rms.wgsl, wload.wgsl.

override WG: u32 = 128;
override W_F16: bool = false;

var<workgroup> partial: array<f32, WG>;
