// RMSNorm with one subgroup per row: a workgroup owns ROWS rows spread over its
// subgroups; a subgroup streams its row with lane-strided (coalesced) loads,
// reduces x² (or h² of the fused residual form, h = x + r) with one subgroupAdd,
// then writes y = x * inv_rms * w (or (1 + w)).
// No workgroup memory, no barriers: suited to many short rows (prefill). Needs
// SUBGROUP and a workgroup at least one subgroup wide.
// Includes: norm_rms.wgsl or fused_residual_rms_norm.wgsl (interface, row body),
// row_sg.wgsl (entry point), reduce_sg.wgsl, rms.wgsl, wload.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override W_F16: bool = false;
