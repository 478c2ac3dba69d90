// Quantized GEMV y[n] = w[n,k] · x[k] reduced with subgroup operations: each
// subgroup owns whole rows (sg, sg + num_subgroups, ... of the workgroup's ROWS),
// its lanes stride over the row's quant words (dequantized in registers, QFMT
// selects q8_0 / q4_0 / q4_1) and one subgroupAdd finishes the row; no workgroup
// memory, no barriers. Needs SUBGROUP and k a whole number of blocks (qbe()).
// Includes: qgemv.wgsl (interface), qblock.wgsl (block decoding), row_sg.wgsl
// (entry point), reduce_sg.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override QFMT: u32 = 0u;

fn run_row(row: u32, lane: u32, stride: u32) {
    let wpr = dims.k / qbe() * qunits();
    var acc = 0.0;
    for (var wi = lane; wi < wpr; wi += stride) {
        acc += qdot(row * wpr, wi, 0u);
    }
    let total = row_sum(acc, lane);
    if (lane == 0u) {
        y[row] = total;
    }
}
