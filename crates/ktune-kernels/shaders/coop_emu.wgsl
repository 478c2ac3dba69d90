// Head of the shaders that emulate the cooperative-matrix tilings in plain loops
// (mma_emu.wgsl, attn_mma_emu.wgsl): f16 tiles, and the matrix side MAT an override
// where coop8.wgsl and coop16.wgsl fix it with their matrix types.
enable f16;

override MAT: u32 = 16;   // matrix side, 8 or 16
