//! The top-level error: every module's error gathered in one type that knows its
//! exit code (0 ok, 1 a check found differences, 2 error).

use crate::{device::DeviceError, gpu::GpuError, kernels::KernelError, model::ModelError};

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
    Profile(#[from] crate::profile::ProfileError),
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
    /// Process exit code for this error (always 2: differences are not errors, see
    /// [`crate::commands::Outcome`]).
    pub fn exit_code(&self) -> i32 {
        2
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
