//! ktune's kernel benchmarks live in `benches/` (`cargo bench -p ktune-bench --bench NAME`):
//! `kernels` (criterion: every GEMV/GEMM/norm kernel at Gemma 3 1B shapes in GB/s and
//! GFLOP/s against the bandwidth probe), and the hand-timed probes `probe_kq`,
//! `qdot_rows`, `qx8_f32` and `vision_ops`. A crate of their own, outside the
//! workspace's default members, so that `cargo test` at the root builds neither
//! them nor criterion; this library is empty.
