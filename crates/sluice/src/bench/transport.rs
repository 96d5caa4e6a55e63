//! `sluice bench transport` (work in progress).

/// Options of `sluice bench transport`.
#[derive(clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Options of the hidden server child.
#[derive(clap::Args)]
pub struct ServerArgs {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}

pub fn run_server(_args: ServerArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
