// Quantized GEMM y[m,n] = x[m,k] · w[n,k]ᵀ on 8x8x8 cooperative matrices
// (wgpu's EXPERIMENTAL_COOPERATIVE_MATRIX): x and the dequantized weights staged as
// f16 in workgroup memory, f32 accumulation. The entry point is qgemm_coop.wgsl, the
// tiles and staging qgemm_mma.wgsl, the block decoding qblock.wgsl. Needs k a whole
// number of blocks (qbe()); any m and n.
enable f16;
enable wgpu_cooperative_matrix;

alias CoopA = coop_mat8x8<f16, A>;
alias CoopB = coop_mat8x8<f16, B>;
alias CoopC = coop_mat8x8<f32, C>;
const MAT: u32 = 8u;

override SG_M: u32 = 2;   // subgroups along m
override SG_N: u32 = 2;   // subgroups along n
override MAT_M: u32 = 2;  // matrices per subgroup along m (<= 4)
override MAT_N: u32 = 2;  // matrices per subgroup along n (MAT_M * MAT_N <= 8)
override TILE_K: u32 = 32; // 32 or 64
override QFMT: u32 = 0u;
override WGS: u32 = 128;  // SG_M * SG_N * 32

struct Dims { m: u32, n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

var<workgroup> xs: array<f16, SG_M * MAT_M * 8u * (TILE_K + 8u)>;
var<workgroup> wt: array<f16, SG_N * MAT_N * 8u * (TILE_K + 8u)>;
var<workgroup> cs: array<f32, SG_M * SG_N * 8u * 8u>;
