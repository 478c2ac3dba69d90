// The projector's average pool, separable: `along_x` sums each input grid row's
// kernel-wide runs into a [side, out, dim] buffer of partial sums (`part`), then
// `along_y` sums kernel of those rows per output and scales: 2 kernel reads per
// output value instead of kernel². One value per invocation in both; linear index
// over a 2D grid (`wid.x + wid.y * nwg.x`).

override WG: u32 = 128;

struct Dims { side: u32, kernel: u32, dim: u32, out: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;
@group(0) @binding(3) var<storage, read_write> part: array<f32>;

@compute @workgroup_size(WG)
fn along_x(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * WG + lid;
    let dim = dims.dim;
    if (i >= dims.side * dims.out * dim) {
        return;
    }
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
fn along_y(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * WG + lid;
    let dim = dims.dim;
    if (i >= dims.out * dims.out * dim) {
        return;
    }
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
