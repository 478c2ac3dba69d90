// Prefill attention with the tiling of attention_prefill_coop16 in plain loops
// (entry point attn_mma_emu.wgsl; block, staging, masks and row passes:
// attn_mma.wgsl): the same f16 tiles and two passes, virtual subgroups of 32
// invocations. Needs SHADER_F16 and head_dim a multiple of 16.
enable f16;

override BQ: u32 = 16;   // query tokens per workgroup (a multiple of 16)
override BK: u32 = 32;   // keys per tile (a multiple of 16)
override NSG: u32 = 2;   // virtual subgroups of 32 invocations
override WGS: u32 = 64;  // NSG * 32
override NS: u32 = 1;    // S matrices per subgroup and tile: ceil((BQ / 16)(BK / 16) / NSG)
override NO: u32 = 2;    // O matrices per subgroup: ceil((BQ / 16)(HD / 16) / NSG) <= 8
override HD: u32 = 64;
override W_F16: bool = false;

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> kc: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> vc: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

var<workgroup> qs: array<f16, BQ * (HD + 8u)>;
var<workgroup> kv: array<f16, BK * (HD + 8u)>;
var<workgroup> ss: array<f32, BQ * BK>;
var<workgroup> ps: array<f16, BQ * (BK + 8u)>;
var<workgroup> rm: array<f32, BQ>;
var<workgroup> rl: array<f32, BQ>;
