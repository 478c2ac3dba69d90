// Head of the second-generation quantized projections (qdp4a.wgsl): the overrides
// every family (qdp4a_gemv.wgsl, qdp4a_gate_up.wgsl, qdp4a_qkv.wgsl) and both entry
// points (qdp4a_main_wg.wgsl: one workgroup tree reduction; qdp4a_main_sg.wgsl:
// subgroupAdd) read; qdp4a.wgsl says what each means.

override WG: u32 = 128;
override ROWS: u32 = 4;
override QFMT: u32 = 0u;
override VW: u32 = 4u;
override ACT: u32 = 8u;
override SPLIT: u32 = 1u;
