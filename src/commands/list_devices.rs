//! `ktune list-devices`: every adapter on every backend and the CPU.

use crate::Result;
use crate::device;
use crate::report::DevicesReport;

pub fn run() -> Result<DevicesReport> {
    let devices = device::discover();
    let default_index = device::select(&devices, None)?;
    Ok(DevicesReport { devices: devices.iter().enumerate().map(|(i, d)| d.summary(i)).collect(), default_index })
}
