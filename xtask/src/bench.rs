use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum Which {}

pub fn run(which: Which) -> Result<()> {
    match which {}
}
