// Head of qgemm_tiled with f32 workgroup tiles (f16_tiles = 0).
// Tile rows of TILE_K / 4 + 1 vec4<f32>: an odd stride in 16-byte units.

alias TileV = vec4<f32>;
