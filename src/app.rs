//! The application: runs the parsed command, hands its report to `output` for the
//! chosen format, and says how the process ends. Warnings and progress go to
//! stderr, results to stdout.

use crate::Result;
use crate::cli::{Cli, Command, Format, ProfilesAction};
use crate::commands::{
    bench, bench_kernels, chat, completions, eval, kernels, list_devices, man, profiles, pull, report as html_report, run, serve, tune,
};
use crate::error::ExitCode;
use crate::output::{self, Bars, TextStream};
use crate::report::{ProfilesReport, SchemaReport};

/// Runs the parsed command line; returns how the process ends when no error did.
pub fn dispatch(cli: Cli) -> Result<ExitCode> {
    let device = cli.device.as_deref();
    match cli.command {
        Command::ListDevices(args) => {
            let report = list_devices::run()?;
            output::emit(&report, args.format.into())?;
            Ok(ExitCode::Success)
        }
        Command::Kernels(args) => {
            let report = kernels::run(device, &args, &Bars::counter("verifying"))?;
            emit_verdict(&report, report.failed(), args.format.into())
        }
        Command::Run(args) => {
            let settings = args.settings()?;
            let report = if args.format == Format::Table {
                // The generated text goes to stdout as it is produced.
                let mut stream = TextStream::new();
                let r = run::run_streaming(device, &settings, &mut |t| stream.piece(t))?;
                stream.finish();
                r
            } else {
                run::run(device, &settings)?
            };
            for w in &report.warnings {
                output::warn(w);
            }
            output::emit(&report, args.format.into())?;
            Ok(ExitCode::Success)
        }
        Command::Chat(args) => {
            chat::run(device, &args, &|w| output::warn(w))?;
            Ok(ExitCode::Success)
        }
        Command::Serve(args) => {
            serve::run(device, &args, &|w| output::warn(w))?;
            Ok(ExitCode::Success)
        }
        Command::Tune(args) => {
            let report = tune::run(device, &args, &Bars::tune())?;
            // `--report`: the page of the profile beside each copy of it (the cached
            // one, then -o), each naming the copy it sits beside.
            for (html, yaml) in report.reports.iter().zip(std::iter::once(&report.path).chain(&report.output)) {
                output::report_html::write(&html_report::single(yaml, report.profile.clone(), html), html)?;
            }
            output::emit(&report, args.format.into())?;
            Ok(ExitCode::Success)
        }
        Command::Profiles(args) => {
            let report = profiles::run(&args.action)?;
            // `list` and the bundle actions have a format; the others print their text.
            let format = match (&args.action, &report) {
                (ProfilesAction::List { format }, ProfilesReport::List(_)) => *format,
                (
                    ProfilesAction::Export { format, .. } | ProfilesAction::Import { format, .. } | ProfilesAction::Merge { format, .. },
                    ProfilesReport::Bundle(_),
                ) => *format,
                _ => Format::Table,
            };
            output::emit(&report, format.into())?;
            Ok(ExitCode::Success)
        }
        Command::DiffProfiles(args) => {
            let (report, code) = profiles::diff_profiles(&args)?;
            output::emit(&report, args.format.into())?;
            Ok(code)
        }
        Command::Bench(args) => {
            let report = bench::run(device, &args, &Bars::counter("bench"))?;
            for w in &report.warnings {
                output::warn(w);
            }
            output::emit(&report, args.format.into())?;
            Ok(ExitCode::Success)
        }
        Command::Eval(args) => {
            let report = eval::run(device, &args, &Bars::counter("eval"))?;
            for w in &report.warnings {
                output::warn(w);
            }
            output::emit(&report, args.output_format().into())?;
            Ok(ExitCode::Success)
        }
        Command::BenchKernels(args) => {
            let report = bench_kernels::run(device, &args, &Bars::counter("bench-kernels"))?;
            emit_verdict(&report, report.failed(), args.format.into())
        }
        Command::Report(args) => {
            let report = html_report::run(&args)?;
            output::report_html::write(&report, &report.output)?;
            output::emit(&report, output::Format::Table)?;
            Ok(ExitCode::Success)
        }
        Command::Completions(args) => {
            output::emit(&completions::run(args.shell)?, output::Format::Table)?;
            Ok(ExitCode::Success)
        }
        Command::Man(args) => {
            output::emit(&man::run(args.output.as_deref())?, output::Format::Table)?;
            Ok(ExitCode::Success)
        }
        Command::Pull(args) => {
            output::emit(&pull::run(&args, &Bars::download())?, args.format.into())?;
            Ok(ExitCode::Success)
        }
        Command::Schema => {
            let report = SchemaReport(crate::profile::json_schema());
            output::emit(&report, output::Format::Json)?;
            Ok(ExitCode::Success)
        }
    }
}

/// Emits a report that may hold failures (parity, a winner that failed its
/// check): the process then ends with [`ExitCode::Differences`].
fn emit_verdict<R: output::Report>(report: &R, failed: bool, format: output::Format) -> Result<ExitCode> {
    output::emit(report, format)?;
    Ok(if failed { ExitCode::Differences } else { ExitCode::Success })
}
