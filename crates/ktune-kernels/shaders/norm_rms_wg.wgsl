// RMSNorm with one workgroup per row: every invocation accumulates x² (or h² of
// the fused residual form, h = x + r, written as it is read) over a WG-strided
// slice of the row, the workgroup reduces the WG partial sums with a tree
// in workgroup memory, then every invocation rereads its slice and writes y.
// Includes: norm_rms.wgsl or fused_residual_rms_norm.wgsl (interface, row body),
// row_wg.wgsl (entry point), reduce_wg.wgsl (the tree), rms.wgsl, wload.wgsl.

override WG: u32 = 128;
override W_F16: bool = false;

var<workgroup> partial: array<f32, WG>;
