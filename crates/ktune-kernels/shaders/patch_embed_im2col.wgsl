// im2col for patch_embed_im2col: the image's patches laid out as the rows of a
// [patches, channels * patch * patch] matrix (each row in the conv weight's
// flattening: channel, then ky, then kx), one element per invocation; the second
// dispatch is linear_tiled over it. Entry point: grid_main.wgsl (one invocation
// per element, a linear index over a 2D grid, grid.wgsl).
// Requires: grid_main.wgsl.

override WG: u32 = 256;

struct Dims { patches: u32, k: u32, image: u32, psize: u32, side: u32 }

@group(0) @binding(0) var<storage, read> pixels: array<f32>;
@group(0) @binding(1) var<storage, read_write> cols: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;

fn item_count() -> u32 {
    return dims.patches * dims.k;
}

fn run_item(i: u32) {
    let p = i / dims.k;
    let c = i % dims.k;
    let pp = dims.psize * dims.psize;
    let ch = c / pp;
    let r = c % pp;
    let yy = (p / dims.side) * dims.psize + r / dims.psize;
    let xx = (p % dims.side) * dims.psize + r % dims.psize;
    cols[i] = pixels[(ch * dims.image + yy) * dims.image + xx];
}
