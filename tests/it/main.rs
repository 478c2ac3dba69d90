//! The integration tests of the `ktune` crate, as one test binary (one link, one
//! process): a module per concern. The readers' fuzz test and the zero-allocation
//! test keep their own binaries, each with its own global allocator.

#[path = "../common/mod.rs"]
mod common;

mod bench_image;
mod bench_kernels;
mod budget;
mod chain;
mod chat;
mod cli;
mod eval;
mod fusion;
mod fuzz_smoke;
mod generate_cache;
mod gpu_counters;
mod gpu_faults;
mod hostile_cli;
mod hub;
mod hub_hostile;
mod layering;
mod model_load;
mod profile;
mod quant_gguf;
mod report;
mod runtime_builtin;
mod runtime_gguf;
mod runtime_hf;
mod runtime_mmproj;
mod runtime_quant;
mod runtime_vision;
mod runtime_vision_gpu;
mod safe_writes;
mod sample;
mod serve;
mod serve_hostile;
mod snapshots;
mod stream_text;
mod timestamps;
mod tokenizer_spm;
mod tune_cli;
