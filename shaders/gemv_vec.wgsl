// GEMV y[n] = w[n,k] · x[k] with 16-byte vector loads and a workgroup reduction.
// Needs k % 4 == 0 (f32 weights) or k % 8 == 0 (f16 weights): each load is one
// vec4<u32>, i.e. 4 f32 weights or 8 packed f16 weights. Each workgroup owns ROWS
// rows; partial sums are kept in registers and reduced through workgroup memory.

override WG: u32 = 128;
override ROWS: u32 = 2;
override W_F16: bool = false;

struct Dims { n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, WG * ROWS>;

fn h2(v: u32) -> vec2<f32> { return unpack2x16float(v); }

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let k = dims.k;
    var acc: array<f32, 8>; // ROWS <= 8 (checked on the host)
    for (var r = 0u; r < ROWS; r++) { acc[r] = 0.0; }
    if (W_F16) {
        // one vec4<u32> = 8 halves; x as two vec4<f32>
        let words_per_row = k / 8u;
        for (var c = tid; c < words_per_row; c += WG) {
            let xa = x[2u * c];
            let xb = x[2u * c + 1u];
            for (var r = 0u; r < ROWS; r++) {
                let row = min(row0 + r, dims.n - 1u);
                let q = w[row * words_per_row + c];
                let wa = vec4<f32>(h2(q.x), h2(q.y));
                let wb = vec4<f32>(h2(q.z), h2(q.w));
                acc[r] += dot(xa, wa) + dot(xb, wb);
            }
        }
    } else {
        let vecs_per_row = k / 4u;
        for (var c = tid; c < vecs_per_row; c += WG) {
            let xv = x[c];
            for (var r = 0u; r < ROWS; r++) {
                let row = min(row0 + r, dims.n - 1u);
                acc[r] += dot(xv, bitcast<vec4<f32>>(w[row * vecs_per_row + c]));
            }
        }
    }
    for (var r = 0u; r < ROWS; r++) { partial[r * WG + tid] = acc[r]; }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            for (var r = 0u; r < ROWS; r++) {
                partial[r * WG + tid] += partial[r * WG + tid + s];
            }
        }
        workgroupBarrier();
    }
    if (tid < ROWS && row0 + tid < dims.n) {
        y[row0 + tid] = partial[tid * WG];
    }
}
