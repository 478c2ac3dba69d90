//! ktune-kernels: the ground floor of ktune, as its own crate.
//!
//! [`device`] discovers every wgpu adapter and the CPU and fingerprints them;
//! [`gpu`] holds the wgpu context (device, queue, pipeline cache, programs,
//! timestamp timing) and the [`shader!`] macro over the WGSL of `shaders/`;
//! [`kernels`] is the registry: one module per op family, float and block formats,
//! WGSL and CPU, the CPU SIMD layer, the f64 references and the parity checker.
//! [`hash`] is the one SHA-256 helper; [`testing`] opens the GPU the test suites run on.
//!
//! It links no tokenizer, image, HTML or command-line crate: the `ktune` crate on
//! top of it holds models, plans, the runtime, the tuner, profiles and the CLI.
//! The crate's `README.md` maps its files: the op families, the CPU layer, the
//! block formats and the shaders.

pub mod device;
pub mod gpu;
pub mod hash;
pub mod kernels;
pub mod testing;
