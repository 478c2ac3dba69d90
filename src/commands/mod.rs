//! One module per subcommand: arguments in, a report value ([`crate::report`])
//! out. Commands neither print nor import one another: [`crate::app`] renders
//! their reports through `output`, and long work reports through
//! [`crate::progress::Progress`].

pub mod bench;
pub mod bench_kernels;
pub mod chat;
pub mod completions;
pub mod eval;
pub mod kernels;
pub mod list_devices;
pub mod man;
pub mod profiles;
pub mod pull;
pub mod report;
pub mod run;
pub mod serve;
pub mod tune;
