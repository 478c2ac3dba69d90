// Head of the tiled float GEMMs over gemm_tile.wgsl (gemm_tiled, linear_tiled): the
// tiling overrides it reads, the weight word format, the uniform block and the
// tiles' element.

override TILE_M: u32 = 64;
override TILE_N: u32 = 64;
override TILE_K: u32 = 16;
override REG_M: u32 = 4;
override REG_N: u32 = 4;
override WGS: u32 = 256; // (TILE_M / REG_M) * (TILE_N / REG_N), set by the host
override W_F16: bool = false;

struct Dims { m: u32, n: u32, k: u32 }

// The workgroup tiles' element (reg_tile.wgsl): f32, as x and the widened weights.
alias TileV = vec4<f32>;
