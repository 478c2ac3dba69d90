// Head of qgemm_tiled with f16 workgroup tiles (f16_tiles = 1): x and the
// dequantized w rounded to f16 on the way into workgroup memory, half the bytes of
// the f32 tiles (so larger tiles fit), read back as vec4<f32>, f32 accumulation.
// Needs SHADER_F16. Tile rows of TILE_K / 4 + 1 vec4<f16>: an odd stride in 8-byte
// units.
enable f16;

alias TileV = vec4<f16>;
