//! Command-line definitions (clap derive) and nothing else.

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(name = "ktune", version, about = "Auto-tuner for transformer-decoder compute kernels (WGSL and CPU)")]
pub struct Cli {
    /// Device: `cpu`, an index from list-devices, a backend (vulkan, gl, metal, dx12),
    /// part of an adapter name, or a fingerprint prefix. Default: the first hardware
    /// GPU, else the CPU.
    #[arg(long, global = true)]
    pub device: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Every wgpu adapter and the CPU, with capabilities and fingerprints.
    ListDevices(ListDevicesArgs),
    /// The kernel set; with --verify, check each variant against the CPU reference.
    Kernels(KernelsArgs),
}

#[derive(clap::Args, Debug)]
pub struct ListDevicesArgs {
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug)]
pub struct KernelsArgs {
    /// Run the parity check of every variant valid on the device; exit 1 if any fails.
    #[arg(long)]
    pub verify: bool,
    /// Only kernels of this op (e.g. gemv, attention_decode).
    #[arg(long)]
    pub op: Option<String>,
    /// Only this kernel id.
    #[arg(long)]
    pub kernel: Option<String>,
    /// With --verify: every combination of parameter values, not each value once.
    #[arg(long)]
    pub all_params: bool,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}
