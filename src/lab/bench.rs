//! The benchmark (work in progress).

use clap::Args;

use super::LabError;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {}

pub fn run(_a: &BenchArgs) -> Result<(), LabError> {
    Err(LabError::Failed("lab bench is not written yet".into()))
}
