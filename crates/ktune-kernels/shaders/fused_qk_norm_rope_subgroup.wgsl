// Fused per-head RMSNorm + RoPE with one subgroup per (token, head): each workgroup
// owns ROWS consecutive heads (the `heads_per_wg` parameter), spread over its
// subgroups (row_sg.wgsl); a subgroup loads the head with lane-strided (coalesced)
// reads, reduces x² with one subgroupAdd and rotates the pairs lane-strided. No
// workgroup memory, no barriers. Needs SUBGROUP and a workgroup at least one
// subgroup wide.
// Includes: fused_qk_norm_rope.wgsl (interface, head body), row_sg.wgsl (entry point),
// reduce_sg.wgsl, rms.wgsl, rotary.wgsl, wload.wgsl.

override WG: u32 = 64;
override ROWS: u32 = 2;
override W_F16: bool = false;
