// Row softmax with one subgroup per row and no workgroup memory or barriers: each
// lane runs the online (max, sum) recurrence over its strided elements, the lanes
// merge with subgroupMax then subgroupAdd of s * exp(m - M), and a second pass
// writes y = exp(x - M) / S. ROWS rows per workgroup, spread over its subgroups:
// suited to many short rows. Needs SUBGROUP and a workgroup at least one subgroup wide.
// Includes: elementwise_softmax.wgsl (interface, row pieces), row_sg.wgsl (entry
// point), reduce_sg.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;

fn run_row(row: u32, lane: u32, stride: u32) {
    let base = row * dims.dim;
    let ms = online_row(base, lane, stride, dims.dim);
    let mx = row_max(ms.x, lane);
    softmax_write(base, lane, stride, dims.dim, mx, 1.0 / row_sum(ms.y * exp(ms.x - mx), lane));
}
