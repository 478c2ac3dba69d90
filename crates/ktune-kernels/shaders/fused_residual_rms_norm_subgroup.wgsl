// Fused residual add + RMSNorm with one subgroup per row: each workgroup owns ROWS
// rows spread over its subgroups; a subgroup streams its row with lane-strided
// (coalesced) loads, writing h = x + r and accumulating h², reduces with one
// subgroupAdd, then rereads its own h and writes y = h * inv_rms * w (or (1 + w)).
// No workgroup memory, no barriers: suited to short rows and many of them. Needs
// SUBGROUP and a workgroup at least one subgroup wide.
// Includes: fused_residual_rms_norm.wgsl (interface, row body), row_sg.wgsl (entry
// point), reduce_sg.wgsl, rms.wgsl, wload.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override W_F16: bool = false;
