//! ktune: an auto-tuner for the compute kernels of transformer decoders.
//!
//! The library holds everything; `main.rs` only parses, calls [`app::dispatch`]
//! and prints the error chain. The application layer: [`commands`] turn arguments
//! into [`report`] values using [`session`] (device, model, warmed engines) and the
//! [`tuner`]; [`output`] renders reports and shows [`progress`]. `ARCHITECTURE.md`
//! at the repository root describes the layout.

pub mod app;
pub mod atomic;
pub mod cli;
pub mod commands;
pub mod error;
pub mod eval;
#[doc(hidden)]
pub mod fuzzing;
pub mod generate;
pub mod input;
pub mod model;
pub mod output;
pub mod plan;
pub mod profile;
pub mod progress;
pub mod report;
pub mod runtime;
pub mod session;
pub mod stats;
pub mod text;
pub mod tuner;

// The ground floor lives in its own crate (`crates/ktune-kernels`); its modules are
// re-exported so every layer above names them as `crate::kernels`, `crate::gpu`, ….
pub use ktune_kernels::{device, gpu, hash, kernels, testing};

pub use error::{Error, ExitCode, Result};
