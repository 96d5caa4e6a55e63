//! A shuffle server's admin endpoints: status, disks, drain.

use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use sluice_server::{DiskStatus, Lifecycle, ServerHandle};

use crate::api;
use crate::http::{action, with_common, Authorized, Probe, Refusal, Token};

#[derive(Clone)]
struct ServerApi {
    handle: ServerHandle,
    token: Token,
}

impl FromRef<ServerApi> for Token {
    fn from_ref(s: &ServerApi) -> Token {
        s.token.clone()
    }
}

impl Probe for ServerHandle {
    fn not_ready(&self) -> Option<&'static str> {
        if !self.is_serving() {
            Some("not_serving")
        } else if self.is_draining() {
            Some("draining")
        } else {
            None
        }
    }

    fn metrics(&self) -> String {
        ServerHandle::metrics(self)
    }
}

/// The router of a server's admin endpoints; write endpoints need `token` when it is `Some`.
pub fn router(handle: ServerHandle, token: Option<String>) -> Router {
    let api = Router::new()
        .route("/api/v1/status", get(status))
        .route("/api/v1/disks", get(disks))
        .route("/api/v1/drain", post(drain).delete(undrain))
        .route("/api/v1/undrain", post(undrain))
        .with_state(ServerApi { handle: handle.clone(), token: Token(token.map(Into::into)) });
    with_common(api, handle)
}

/// A data directory in the API's terms.
pub(crate) fn disk(d: &DiskStatus) -> api::Disk {
    api::Disk {
        path: d.path.clone(),
        free_bytes: d.free_bytes,
        capacity_bytes: d.capacity_bytes,
        state: match d.state {
            sluice_server::DiskState::InService => api::DiskState::InService,
            sluice_server::DiskState::Full => api::DiskState::Full,
            sluice_server::DiskState::Failed => api::DiskState::Failed,
        },
    }
}

fn shuffle_state(l: Lifecycle) -> api::ShuffleState {
    match l {
        Lifecycle::Open => api::ShuffleState::Open,
        Lifecycle::Committing => api::ShuffleState::Committing,
        Lifecycle::Readable => api::ShuffleState::Readable,
        Lifecycle::Deleted => api::ShuffleState::Deleted,
    }
}

async fn status(State(s): State<ServerApi>) -> Json<api::ServerStatus> {
    let r = s.handle.status();
    let apps: Vec<api::HeldApp> = r
        .apps
        .iter()
        .map(|a| api::HeldApp {
            app_id: a.app_id.clone(),
            idle_ms: a.idle_ms,
            shuffles: a
                .shuffles
                .iter()
                .map(|sh| api::HeldShuffle {
                    shuffle_id: sh.shuffle_id,
                    state: shuffle_state(sh.state),
                    maps: sh.maps,
                    maps_ended: sh.maps_ended,
                    partitions: sh.partitions,
                    lost_partitions: sh.lost_partitions,
                    buffered_bytes: sh.buffered_bytes,
                    stored_bytes: sh.stored_bytes,
                    offloaded_bytes: sh.offloaded_bytes,
                    chunks: sh.chunks,
                    flushes_in_flight: sh.flushes_in_flight,
                })
                .collect(),
        })
        .collect();
    Json(api::ServerStatus {
        server_id: r.identity.as_ref().map(|i| i.server_id.clone()),
        address: r.identity.as_ref().map(|i| format!("{}:{}", i.host, i.port)),
        serving: r.identity.is_some(),
        draining: r.draining,
        memory: api::Memory {
            budget_bytes: r.memory_budget_bytes,
            used_bytes: r.memory_used_bytes,
            peak_bytes: r.memory_peak_bytes,
        },
        counters: r.counters,
        connections: r.connections,
        shuffles_held: s.handle.shuffles_held() as u64,
        uncommitted_shuffles: s.handle.uncommitted_shuffles() as u64,
        partitions_held: r.partitions_held,
        apps,
    })
}

async fn disks(State(s): State<ServerApi>) -> Json<api::Disks> {
    Json(api::Disks { disks: s.handle.disks().iter().map(disk).collect() })
}

fn drain_state(h: &ServerHandle) -> Json<api::DrainState> {
    Json(api::DrainState {
        draining: h.is_draining(),
        shuffles_held: h.shuffles_held() as u64,
        uncommitted_shuffles: h.uncommitted_shuffles() as u64,
    })
}

async fn drain(
    State(s): State<ServerApi>,
    _: Authorized,
    body: Bytes,
) -> Result<Json<api::DrainState>, Refusal> {
    let why = action(&body)?.reason.unwrap_or_default();
    tracing::info!(reason = %why, "drain asked through the admin API");
    s.handle.start_draining();
    Ok(drain_state(&s.handle))
}

async fn undrain(
    State(s): State<ServerApi>,
    _: Authorized,
    body: Bytes,
) -> Result<Json<api::DrainState>, Refusal> {
    let why = action(&body)?.reason.unwrap_or_default();
    if !s.handle.stop_draining() {
        return Err(Refusal::new(
            StatusCode::CONFLICT,
            "stopping",
            "the server is stopping (SIGTERM): its drain cannot be cancelled",
        ));
    }
    tracing::info!(reason = %why, "drain cancelled through the admin API");
    Ok(drain_state(&s.handle))
}
