//! One module per subcommand: arguments in, a report struct out. `dispatch` renders
//! the report through `output` and returns the exit code.

pub mod bench;
pub mod kernels;
pub mod list_devices;
pub mod profiles;
pub mod run;
pub mod tune;

use crate::cli::{Cli, Command};
use crate::device::{self, Device};
use crate::{Result, output};

/// Runs the parsed command line; returns the exit code (0 ok, 1 differences found).
pub fn dispatch(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::ListDevices(args) => {
            let report = list_devices::run()?;
            output::print(&output::devices(&report, args.format)?)?;
            Ok(0)
        }
        Command::Kernels(args) => {
            let report = kernels::run(cli.device.as_deref(), &args)?;
            output::print(&output::kernels(&report, args.format)?)?;
            Ok(if report.failed() { 1 } else { 0 })
        }
        Command::Run(args) => {
            let report = if args.format == crate::cli::Format::Table {
                let mut stream = output::TextStream::new();
                let r = run::run_streaming(cli.device.as_deref(), &args, &mut |t| stream.piece(t))?;
                stream.finish();
                r
            } else {
                run::run(cli.device.as_deref(), &args)?
            };
            for w in &report.warnings {
                output::warn(w);
            }
            output::print(&output::run(&report, args.format)?)?;
            Ok(0)
        }
        Command::Tune(args) => {
            let progress = output::TuneProgress::new();
            let report = tune::run(cli.device.as_deref(), &args, &progress)?;
            output::print(&output::tune(&report, args.format)?)?;
            Ok(0)
        }
        Command::Profiles(args) => {
            match profiles::run(&args.action)? {
                profiles::ProfilesOutput::List(rows) => {
                    let format = match args.action {
                        crate::cli::ProfilesAction::List { format } => format,
                        _ => crate::cli::Format::Table,
                    };
                    output::print(&output::profiles(&rows, format)?)?;
                }
                profiles::ProfilesOutput::Text(t) => output::print(&t)?,
            }
            Ok(0)
        }
        Command::DiffProfiles(args) => {
            let (report, code) = profiles::diff_profiles(&args)?;
            output::print(&output::diff(&report, args.format)?)?;
            Ok(code)
        }
        Command::Bench(args) => {
            let report = bench::run(cli.device.as_deref(), &args)?;
            for w in &report.warnings {
                output::warn(w);
            }
            output::print(&output::bench(&report, args.format)?)?;
            Ok(0)
        }
        Command::Schema => {
            output::print(&serde_json::to_string_pretty(&crate::profile::json_schema())?)?;
            Ok(0)
        }
    }
}

/// Discovers devices and resolves the `--device` selector (validated before any
/// heavy object is built).
pub fn pick_device(selector: Option<&str>) -> Result<Device> {
    let mut devices = device::discover();
    let i = device::select(&devices, selector)?;
    Ok(devices.swap_remove(i))
}
