// Row softmax with one subgroup per row and no workgroup memory or barriers: each
// lane runs the online (max, sum) recurrence over its strided elements, the lanes
// merge with subgroupMax then subgroupAdd of s * exp(m - M), and a second pass
// writes y = exp(x - M) / S. ROWS rows per workgroup, spread over its subgroups:
// suited to many short rows. Needs SUBGROUP and a workgroup at least one subgroup wide.
// Includes: softmax.wgsl (row pieces).

override WG: u32 = 128;
override ROWS: u32 = 4;

struct Dims { rows: u32, dim: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let d = dims.dim;
    for (var rr = sg; rr < ROWS; rr += nsg) {
        let row = row0 + rr;
        if (row >= dims.rows) {
            break;
        }
        let base = row * d;
        let ms = online_row(base, lane, sg_size, d);
        let row_max = subgroupMax(ms.x);
        let total = subgroupAdd(ms.y * exp(ms.x - row_max));
        softmax_write(base, lane, sg_size, d, row_max, 1.0 / total);
    }
}
