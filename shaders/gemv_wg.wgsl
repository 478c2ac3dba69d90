// GEMV y[n] = w[n,k] · x[k] with a workgroup-memory tree reduction.
// Each workgroup owns ROWS consecutive rows; every invocation accumulates a partial
// sum for each of them (x read once for all ROWS rows), striding over k by WG, then
// the workgroup reduces WG partials per row. Any k; weights as u32 words decoded by
// W_F16 (f32 bits or packed f16 pairs). Includes: reduce_wg.wgsl (the tree),
// wload.wgsl (W_F16).

override WG: u32 = 128;
override ROWS: u32 = 2;
override W_F16: bool = false;

struct Dims { n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, WG * ROWS>;

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let k = dims.k;
    for (var r = 0u; r < ROWS; r++) {
        partial[r * WG + tid] = 0.0;
    }
    for (var c = tid; c < k; c += WG) {
        let xv = x[c];
        for (var r = 0u; r < ROWS; r++) {
            let row = row0 + r;
            if (row < dims.n) {
                partial[r * WG + tid] += xv * wload(row * k + c);
            }
        }
    }
    wg_sum_rows(tid, ROWS);
    if (tid < ROWS && row0 + tid < dims.n) {
        y[row0 + tid] = partial[tid * WG];
    }
}
