//! # sluice-admin
//!
//! The operations plane over HTTP: each process's admin endpoint (served on its
//! `--metrics-listen` address) answers JSON under `/api/v1`, Prometheus text at `/metrics`,
//! liveness and readiness at `/healthz` and `/readyz`; a coordinator's also serves the status
//! page at `/`. Write endpoints (drain, undrain, unregister) take a bearer token when one is
//! configured (`admin_token`). `docs/openapi.yaml` describes every endpoint; `sluice admin`
//! is the command line over [`AdminClient`].
//!
//! The server and coordinator crates know nothing of HTTP: they expose plain reports and
//! actions ([`sluice_server::ServerHandle`], [`sluice_coordinator::Coordinator`]), and this
//! crate turns them into endpoints.
//!
//! ## Layout
//! Every module but [`api`] is private; the API is the list of re-exports below.
//! - [`api`]: the JSON bodies, shared by the endpoints and the client.
//! - `http`: what both endpoints share: JSON errors (each one logged), the token check
//!   (constant time), `/healthz`, `/readyz`, `/metrics`, 404 and 405 answers, [`serve`].
//! - `server`: a server's routes ([`server_router`]): status, disks, drain.
//! - `coordinator`: a coordinator's routes ([`coordinator_router`]): servers, applications,
//!   shuffles, drain, unregister, and `status_page.html` at `/` and `/status`.
//! - `client`: [`AdminClient`], with its errors mapped onto `sluice admin`'s exit codes.

#![warn(missing_docs)]

pub mod api;
mod client;
mod coordinator;
mod http;
mod server;

pub use client::{segment, AdminClient, Answer, ClientError};
pub use coordinator::router as coordinator_router;
pub use http::serve;
/// The HTTP method of [`AdminClient::call`].
pub use hyper::Method;
pub use server::router as server_router;
