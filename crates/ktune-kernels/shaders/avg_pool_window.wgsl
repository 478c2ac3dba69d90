// The projector's average pool: the [side, side] grid of dim-wide rows pooled over
// kernel x kernel windows with stride kernel, one output value per invocation (each
// sums its window's column). Entry point: grid_main.wgsl (one invocation per
// output value, a linear index over a 2D grid, grid.wgsl).
// Requires: grid_main.wgsl.

override WG: u32 = 128;

struct Dims { side: u32, kernel: u32, dim: u32, out: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;

fn item_count() -> u32 {
    return dims.out * dims.out * dims.dim;
}

fn run_item(i: u32) {
    let dim = dims.dim;
    let kn = dims.kernel;
    let c = i % dim;
    let o = i / dim;
    let y0 = (o / dims.out) * kn;
    let x0 = (o % dims.out) * kn;
    var s = 0.0;
    for (var ky = 0u; ky < kn; ky++) {
        for (var kx = 0u; kx < kn; kx++) {
            s += x[((y0 + ky) * dims.side + x0 + kx) * dim + c];
        }
    }
    y[i] = s / f32(kn * kn);
}
