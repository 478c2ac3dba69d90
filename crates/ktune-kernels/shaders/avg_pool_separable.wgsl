// The projector's average pool, separable: `along_x` sums each input grid row's
// kernel-wide runs into a [side, out, dim] buffer of partial sums (`part`), then
// `along_y` sums kernel of those rows per output and scales: 2 kernel reads per
// output value instead of kernel². One value per invocation in both; linear index
// over a 2D grid (grid.wgsl).
// Requires: grid.wgsl.

override WG: u32 = 128;

struct Dims { side: u32, kernel: u32, dim: u32, out: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;
@group(0) @binding(3) var<storage, read_write> part: array<f32>;

@compute @workgroup_size(WG)
fn along_x(g: Grid) {
    let i = invocation(g);
    if (i >= dims.side * dims.out * dims.dim) { return; }
    let dim = dims.dim;
    let c = i % dim;
    let r = i / dim;
    let iy = r / dims.out;
    let x0 = (r % dims.out) * dims.kernel;
    var s = 0.0;
    for (var kx = 0u; kx < dims.kernel; kx++) {
        s += x[(iy * dims.side + x0 + kx) * dim + c];
    }
    part[i] = s;
}

@compute @workgroup_size(WG)
fn along_y(g: Grid) {
    let i = invocation(g);
    if (i >= dims.out * dims.out * dims.dim) { return; }
    let dim = dims.dim;
    let c = i % dim;
    let o = i / dim;
    let y0 = (o / dims.out) * dims.kernel;
    let ox = o % dims.out;
    var s = 0.0;
    for (var ky = 0u; ky < dims.kernel; ky++) {
        s += part[((y0 + ky) * dims.out + ox) * dim + c];
    }
    y[i] = s / f32(dims.kernel * dims.kernel);
}
