// Quantized GEMV y[n] = w[n,k] · x[k] reduced with subgroup operations: each
// subgroup owns whole rows (sg, sg + num_subgroups, ... of the workgroup's ROWS),
// its lanes stride over the row's block units (dequantized in registers, the block
// format is QFMT) and one subgroupAdd finishes the row; no workgroup
// memory, no barriers. Needs SUBGROUP and k a whole number of blocks (qbe()).
// Includes: qgemv.wgsl (interface), qblock.wgsl (block decoding), row_sg.wgsl
// (entry point), reduce_sg.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override UNROLL: u32 = 1u; // units a lane decodes per round, loads all issued first
override QFMT: u32 = 0u;

fn run_row(row: u32, lane: u32, stride: u32) {
    let wpr = dims.k / qbe() * qunits();
    let round = stride * UNROLL;
    let full = wpr / round * round;
    var acc = 0.0;
    // UNROLL units a lane per round, a loop of constant trip count with no guard:
    // their loads are independent, so all are in flight before the first is used
    for (var w0 = lane; w0 < full; w0 += round) {
        for (var u = 0u; u < UNROLL; u++) {
            acc += qdot(row * wpr, w0 + u * stride, 0u);
        }
    }
    for (var wi = full + lane; wi < wpr; wi += stride) {
        acc += qdot(row * wpr, wi, 0u);
    }
    let total = row_sum(acc, lane);
    if (lane == 0u) {
        y[row] = total;
    }
}
