//! The top-level error: every module's error gathered in one type that knows its
//! exit code, and the [`ExitCode`]s themselves (0 ok, 1 a check found differences,
//! 2 error).

use crate::{device::DeviceError, gpu::GpuError, kernels::KernelError, model::ModelError};

/// How the process ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum ExitCode {
    Success = 0,
    /// `kernels --verify` found a failing variant, or `diff-profiles` a regression.
    Differences = 1,
    /// An [`Error`] (and clap's own usage errors).
    Error = 2,
}

impl From<ExitCode> for i32 {
    fn from(c: ExitCode) -> i32 {
        c as i32
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    #[error(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
    #[error(transparent)]
    Tune(Box<crate::tuner::TuneError>),
    #[error(transparent)]
    KernelBench(#[from] crate::tuner::kbench::KBenchError),
    #[error(transparent)]
    Profile(#[from] crate::profile::ProfileError),
    #[error(transparent)]
    Bundle(#[from] crate::profile::bundle::BundleError),
    #[error(transparent)]
    Session(#[from] crate::session::SessionError),
    #[error(transparent)]
    Image(#[from] crate::runtime::image::ImageError),
    #[error(transparent)]
    Eval(#[from] crate::eval::EvalError),
    /// A file the user named that cannot be written there ([`crate::atomic`]).
    #[error(transparent)]
    Write(#[from] crate::atomic::WriteError),
    #[error("{0}")]
    Usage(String),
    #[error("writing output failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("serializing output failed: {0}")]
    Json(#[from] serde_json::Error),
}

impl From<crate::tuner::TuneError> for Error {
    fn from(e: crate::tuner::TuneError) -> Error {
        Error::Tune(Box::new(e))
    }
}

impl Error {
    /// Process exit code for this error: always [`ExitCode::Error`] (differences
    /// found are not errors: a command reports them with its result, see
    /// [`crate::app::dispatch`]).
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::Error
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
