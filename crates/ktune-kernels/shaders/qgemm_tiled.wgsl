// Quantized tiled GEMM y[m,n] = x[m,k] · w[n,k]ᵀ with w in ggml blocks (QFMT, any
// format of qblock.wgsl). Each workgroup computes a TILE_M x TILE_N tile of y; per
// step it stages TILE_K (32 or 64: whole 32-element block chunks) of x and of w in
// workgroup memory, the weights dequantized on the way in (each invocation decodes
// whole quant words), and every invocation accumulates a REG_M x REG_N register
// block from vec4 dot products. Its rows and columns are strided by the thread grid
// (row ty + i·TILE_M/REG_M, column tx + j·TILE_N/REG_N), so neighbouring invocations
// read neighbouring tile rows and write neighbouring columns of y.
//
// Tiles are vec4 rows of TILE_K / 4 + 1 vec4 (one vec4 of padding). TILE_K / 4 is 8
// or 16, so the row stride is odd in 16-byte units: the 8 invocations of a quarter
// wave that read 8 different w rows (one 128-bit load each) hit 8 different groups
// of 4 banks, and the x rows a wave reads (two or four different ty) do too.
//
// With DOUBLE_BUF = 1 the tiles are held twice: step st + 1 is staged into one
// buffer while step st is read from the other, and a single barrier per step
// separates them (a buffer's last reads come before the barrier that precedes its
// next staging).
//
// Tiles hold TileV, the head's: vec4<f32> (qgemm_tiled_f32.wgsl) or vec4<f16>
// (qgemm_tiled_f16.wgsl: half the workgroup memory; f32 accumulation). The staging
// and the main loop are qgemm_tiled_body.wgsl, the register block reg_tile.wgsl
// (shared with the float tiled GEMMs).
//
// Needs k a whole number of blocks (qbe()); any m and n. Bindings: qgemm.wgsl's.

override TILE_M: u32 = 32;
override TILE_N: u32 = 64;
override TILE_K: u32 = 32;
override REG_M: u32 = 4;
override REG_N: u32 = 4;
override QFMT: u32 = 0u;
// Invocations: (TILE_M / REG_M) * (TILE_N / REG_N), set by the host.
override WGS: u32 = 128;
// 1: two tile buffers, the next step staged while this one is read, one barrier
// per step (0: one buffer, two barriers per step).
override DOUBLE_BUF: u32 = 0u;

// Buffer b (0, or 1 with DOUBLE_BUF), row r of a tile, vec4 c along k, at
// (b * rows + r) * (TILE_K / 4 + 1) + c.
var<workgroup> xs: array<TileV, (1u + DOUBLE_BUF) * TILE_M * (TILE_K / 4u + 1u)>;
var<workgroup> wt: array<TileV, (1u + DOUBLE_BUF) * TILE_N * (TILE_K / 4u + 1u)>;

