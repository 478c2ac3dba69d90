// The interface of the float GEMVs that read the weights as 16-byte words
// (`shader!(VARIANT, "gemv16.wgsl", ..)`: gemv_vec, gemv_subgroup, gemv_thread):
// x as vec4<f32>, w as vec4<u32> words (4 f32 or 8 packed f16 weights, wload.wgsl),
// one output per row, and the uniform block. Needs k % 4 == 0 (f32) or k % 8 == 0
// (f16).

struct Dims { n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

fn row_count() -> u32 {
    return dims.n;
}
