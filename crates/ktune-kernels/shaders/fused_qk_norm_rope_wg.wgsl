// Fused per-head RMSNorm + RoPE with one workgroup per (token, head): the workgroup
// reduces x² through workgroup memory, then its invocations rotate the pairs
// WG-strided.
// Includes: fused_qk_norm_rope.wgsl (interface, head body), row_wg.wgsl (entry
// point), reduce_wg.wgsl (the tree), rms.wgsl, rotary.wgsl, wload.wgsl.

override WG: u32 = 64;
override W_F16: bool = false;

var<workgroup> partial: array<f32, WG>;
