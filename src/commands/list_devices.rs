//! `ktune list-devices`: every adapter on every backend and the CPU.

use serde::Serialize;

use crate::Result;
use crate::device::{self, DeviceSummary};

#[derive(Debug, Serialize)]
pub struct DevicesReport {
    pub devices: Vec<DeviceSummary>,
    /// Index `--device` picks when not given.
    pub default_index: usize,
}

pub fn run() -> Result<DevicesReport> {
    let devices = device::discover();
    let default_index = device::select(&devices, None)?;
    Ok(DevicesReport { devices: devices.iter().enumerate().map(|(i, d)| d.summary(i)).collect(), default_index })
}
