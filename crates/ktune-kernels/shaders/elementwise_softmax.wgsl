// Row softmax y = exp(x - max) / Σ exp(x - max): the interface and the row pieces of
// elementwise_softmax_wg, _online and _subgroup (`shader!(VARIANT,
// "elementwise_softmax.wgsl", ..)`). A row of d values starting at `base` is walked
// by one workgroup or one subgroup, invocation `first` taking c = first,
// first + stride, ... Any dim.

struct Dims { rows: u32, dim: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;

fn row_count() -> u32 {
    return dims.rows;
}

// Finite stand-in for -inf: an empty partial (m = NEG, s = 0) merges as a no-op.
const NEG: f32 = -3.0e38;

// The online (max m, sum s of exp(x - m)) of the invocation's share of the row:
// s is rescaled whenever m grows.
fn online_row(base: u32, first: u32, stride: u32, d: u32) -> vec2<f32> {
    var m = NEG;
    var s = 0.0;
    for (var c = first; c < d; c += stride) {
        let v = x[base + c];
        if (v > m) {
            s = s * exp(m - v) + 1.0;
            m = v;
        } else {
            s += exp(v - m);
        }
    }
    return vec2<f32>(m, s);
}

// y = exp(x - row_max) * inv over the invocation's share of the row.
fn softmax_write(base: u32, first: u32, stride: u32, d: u32, row_max: f32, inv: f32) {
    for (var c = first; c < d; c += stride) {
        y[base + c] = exp(x[base + c] - row_max) * inv;
    }
}
