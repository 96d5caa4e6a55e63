//! # sluice-testkit
//!
//! Starting and watching `sluice` child processes, for the two places that run a cluster of
//! them on loopback: the binary's embedded cluster (`sluice local`, `sluice bench push|fetch`)
//! and the integration tests' harness (`crates/sluice/tests/utils`). It depends on std,
//! `anyhow`, `tempfile`, tokio's timer, rcgen (the throw-away CA of `--tls`) and the workspace's
//! `sluice-proto` and `sluice-transport` only.
//!
//! ## Layout
//! Every module is private; the API is the list of re-exports below.
//! - `proc`: [`Proc`] — one child on port 0: spawned, its address lines awaited (bounded), its
//!   stdout drained and its stderr inherited or written to a log file, `/proc` figures, killed
//!   and reaped on drop.
//! - `launcher`: [`Launcher`] — children that share one temporary directory for their data and
//!   logs, started from a [`ServerSpec`] or as a coordinator.
//! - `metrics`: [`scrape`] a metrics endpoint, [`metric`] one value of it.
//! - `ready`: [`wait_registered`] — until the coordinator assigns over every server.
//! - `pki`: [`TestPki`] — a throw-away CA and the certificates it signs (rcgen), as PEM files.

#![warn(missing_docs)]

mod launcher;
mod metrics;
mod pki;
mod proc;
mod ready;

pub use launcher::{Launcher, ServerSpec};
pub use metrics::{metric, scrape, scrape_tls};
pub use pki::TestPki;
pub use proc::{proc_status_kib, Proc, START_TIMEOUT};
pub use ready::wait_registered;
