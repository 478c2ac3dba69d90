//! `ktune pull --hf REPO[:QUANT_OR_FILE][@REVISION]`: downloads a model from the
//! Hugging Face Hub into the hub cache ([`crate::model::hub`]) and reports where
//! it lies. Unlike `--hf` on the other commands, it asks the hub for the
//! revision's current commit even when a snapshot is cached (offline, the cache).

use crate::Result;
use crate::cli::PullArgs;
use crate::model::ModelError;
use crate::model::hub::{Hub, HubSpec, Resolved};
use crate::progress::Progress;

pub fn run(args: &PullArgs, progress: &dyn Progress) -> Result<Resolved> {
    let spec = HubSpec::parse(&args.hf).map_err(ModelError::from)?;
    Ok(Hub::from_env().resolve(&spec, true, progress).map_err(ModelError::from)?)
}
