// Head of the matrix-tile GEMMs (after coop8.wgsl, coop16.wgsl or coop_emu.wgsl,
// which fix the matrix side MAT): the tiling overrides mma.wgsl reads and the
// uniform block. The shader's own file (qgemm_mma.wgsl, gemm_mma.wgsl) adds the
// weight format's override and the bindings.

override SG_M: u32 = 2;   // subgroups along m
override SG_N: u32 = 2;   // subgroups along n
override MAT_M: u32 = 2;  // matrices per subgroup along m (<= 4)
override MAT_N: u32 = 2;  // matrices per subgroup along n (emulation: W_MATS * MAT_M * MAT_N * MAT * MAT / 32 <= 64, host)
override TILE_K: u32 = 32; // 32 or 64
override W_MATS: u32 = 1u; // weight matrices: 1 gemm, 2 gate_up (gate and up)
override WGS: u32 = 128;  // SG_M * SG_N * 32
override STAGES: u32 = 1u; // tile buffers: 1, or 2 (next step's loads in flight during the matrix work)

struct Dims { m: u32, n: u32, k: u32, act: u32 } // act (gate_up): 0 silu, 1 gelu_tanh
