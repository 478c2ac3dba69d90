// Second-generation quantized GEMV, finished by one workgroup tree reduction
// (gemv_q_dp4a_wg). Includes: qdp4a_gemv.wgsl (the family: y, split partials,
// sum_splits), qdp4a_main_wg.wgsl (the entry point), qdp4a.wgsl (the activation
// step and the weight dots), reduce_wg.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override QFMT: u32 = 0u;
override VW: u32 = 4u;
override ACT: u32 = 8u;
override SPLIT: u32 = 1u;

var<workgroup> partial: array<f32, WG * ROWS>;
