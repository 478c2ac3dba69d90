// Fused Q/K/V projection of one token with subgroup reductions and 16-byte loads:
// rows of the concatenated weight w[nq + 2 nkv, k] are owned by whole subgroups
// (ROWS rows per workgroup, spread over its subgroups), each lane loads 16 bytes per
// step and one subgroupAdd finishes the row; lane 0 adds the bias and routes the row
// to q, k_out or v_out. No workgroup memory, no barriers. Needs SUBGROUP and
// k % 4 == 0 (f32) or k % 8 == 0 (f16).
//
// Head: qkv_head.wgsl (the bias and output bindings 2..6). Includes:
// row_dot16.wgsl (the lane dot), row_sg.wgsl (entry point), reduce_sg.wgsl,
// qkv_store.wgsl (the routing, Dims), wload.wgsl (W_F16, 16-byte words).
// Requires: qkv_head.wgsl, qkv_store.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override UNROLL: u32 = 1u; // row_dot16's words in flight per lane (not tuned here)
override W_F16: bool = false;

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;

fn run_row(row: u32, lane: u32, stride: u32) {
    let total = row_sum(row_dot16(row, lane, stride), lane);
    if (lane == 0u) {
        qkv_store(row, total);
    }
}
