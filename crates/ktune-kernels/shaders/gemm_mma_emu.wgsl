// Float GEMM y[m,n] = x[m,k] · w[n,k]ᵀ, or with W_MATS = 2 the fused gate_up y[m,n] =
// act(x · w[0..n]ᵀ) · (x · w[n..2n]ᵀ), with the tiling of gemm_coop8/16 in plain loops:
// x and w f32 or f16 (W_F16: 16-byte words of packed f16, wload.wgsl), staged as f16 in
// workgroup memory, f32 accumulation. Entry point mma_emu.wgsl, tiles and output
// mma.wgsl, weight staging mma_f.wgsl, the activation act.wgsl. Needs k a multiple of 4
// (f32) or 8 (f16); any m and n.
enable f16;

override MAT: u32 = 16;   // matrix side, 8 or 16

override SG_M: u32 = 2;   // subgroups along m
override SG_N: u32 = 2;   // subgroups along n
override MAT_M: u32 = 2;  // matrices per subgroup along m
override MAT_N: u32 = 2;  // W_MATS * MAT_M * MAT_N * MAT * MAT / 32 <= 64 (host)
override TILE_K: u32 = 32; // 32 or 64
override W_MATS: u32 = 1u; // weight matrices: 1 gemm, 2 gate_up (gate and up)
override WGS: u32 = 128;  // SG_M * SG_N * 32
override STAGES: u32 = 1u; // tile buffers: 1, or 2 (next step's loads in flight during the matrix work)
override W_F16: bool = false;

struct Dims { m: u32, n: u32, k: u32, act: u32 } // act (gate_up): 0 silu, 1 gelu_tanh

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> xs: array<f16, STAGES * SG_M * MAT_M * MAT * (TILE_K + 8u)>;
var<workgroup> wt: array<f16, STAGES * W_MATS * SG_N * MAT_N * MAT * (TILE_K + 8u)>;
var<workgroup> cs: array<f32, W_MATS * SG_M * SG_N * MAT * MAT>;
