//! ktune: an auto-tuner for the compute kernels of transformer decoders.
//!
//! The library holds everything; `main.rs` only parses, calls [`commands`] and
//! prints the error chain. See `DESIGN.md` for the architecture.

pub mod cli;
pub mod commands;
pub mod device;
pub mod error;
pub mod gpu;
pub mod kernels;
pub mod model;
pub mod output;
pub mod plan;
pub mod profile;
pub mod runtime;
pub mod testing;
pub mod tuner;

pub use error::{Error, Result};
