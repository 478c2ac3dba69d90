// Second-generation quantized GEMV, finished by subgroupAdd
// (gemv_q_dp4a_subgroup). Includes: qdp4a_gemv.wgsl (the family: y, split
// partials, sum_splits), qdp4a_main_sg.wgsl (the entry point), qdp4a.wgsl (the
// activation step and the weight dots).

override WG: u32 = 128;
override ROWS: u32 = 4;
override QFMT: u32 = 0u;
override VW: u32 = 4u;
override ACT: u32 = 8u;
override SPLIT: u32 = 1u;

var<workgroup> sg_part: array<f32, WG * ROWS>;
