// Fused Q/K/V projection of one token with subgroup reductions and 16-byte loads:
// rows of the concatenated weight w[nq + 2 nkv, k] are owned by whole subgroups
// (ROWS rows per workgroup, spread over its subgroups), each lane loads 16 bytes per
// step and one subgroupAdd finishes the row; lane 0 adds the bias and routes the row
// to q, k_out or v_out. No workgroup memory, no barriers. Needs SUBGROUP and
// k % 4 == 0 (f32) or k % 8 == 0 (f16).
//
// Bindings: the bias is always bound at 2 (q, k_out, v_out at 3..5, uniform at 6);
// without a bias the host binds a small placeholder there and HAS_BIAS is false.
// Includes: row_dot16.wgsl (the lane dot), row_sg.wgsl (entry point), reduce_sg.wgsl, qkv_store.wgsl (the routing),
// wload.wgsl (W_F16, 16-byte words).

override WG: u32 = 128;
override ROWS: u32 = 4;
override UNROLL: u32 = 1u; // row_dot16's words in flight per lane (not tuned here)
override W_F16: bool = false;
override HAS_BIAS: bool = false;

struct Dims { k: u32, nq: u32, nkv: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> q: array<f32>;
@group(0) @binding(4) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_out: array<f32>;
@group(0) @binding(6) var<uniform> dims: Dims;

fn run_row(row: u32, lane: u32, stride: u32) {
    let total = row_sum(row_dot16(row, lane, stride), lane);
    if (lane == 0u) {
        qkv_store(row, total);
    }
}
