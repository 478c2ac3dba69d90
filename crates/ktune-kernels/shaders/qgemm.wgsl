// The interface of the quantized GEMMs y[m,n] = x[m,k] · w[n,k]ᵀ (qgemm_tiled,
// qgemm_rows_subgroup; `shader!(.., "qgemm.wgsl", ..)`): x as vec4 rows, the
// weight buffer bound twice (quants at 1, the scales region at 2, read by
// qblock.wgsl), y, the uniform.

struct Dims { m: u32, n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;
