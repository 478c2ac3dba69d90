// Prefill attention on 16x16x16 cooperative matrices (wgpu's
// EXPERIMENTAL_COOPERATIVE_MATRIX: NVIDIA tensor cores, Apple simdgroup matrices,
// Intel XMX), flash style in two passes: S = Q·Kᵀ and O += P·V as f16 matrices with
// f32 accumulation, O held in the matrix registers for the whole block (the
// softmax's maxima come from a first pass over the scores, so O is never rescaled).
// Block, staging, masks and row passes: attn_mma.wgsl; entry point:
// attn_mma_coop.wgsl. Needs head_dim a multiple of 16 and subgroups of exactly 32.
enable f16;
enable wgpu_cooperative_matrix;

alias CoopA = coop_mat16x16<f16, A>;
alias CoopB = coop_mat16x16<f16, B>;
alias CoopC = coop_mat16x16<f32, C>;

override BQ: u32 = 16;   // query tokens per workgroup (a multiple of 16)
override BK: u32 = 32;   // keys per tile (a multiple of 16)
override NSG: u32 = 2;   // subgroups
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
var<workgroup> cs: array<f32, NSG * 256u>;
