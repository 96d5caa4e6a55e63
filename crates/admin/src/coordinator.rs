//! A coordinator's admin endpoints: servers, applications, shuffles; drain, undrain,
//! unregister; and the status page.

use std::sync::Arc;

use axum::extract::{FromRef, Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use sluice_coordinator::{Coordinator, DrainMark, ServerState, ServerSummary, ShuffleSummary};
use sluice_proto::message::ServerAddr;

use crate::api;
use crate::http::{action, with_common, Authorized, Probe, Refusal, Token};

/// The status page: plain HTML and a little JavaScript that reads the JSON endpoints.
const STATUS_PAGE: &str = include_str!("status_page.html");

#[derive(Clone)]
struct CoordApi {
    coord: Arc<Coordinator>,
    token: Token,
}

impl FromRef<CoordApi> for Token {
    fn from_ref(s: &CoordApi) -> Token {
        s.token.clone()
    }
}

/// Readiness and metrics of a coordinator.
#[derive(Clone)]
struct CoordProbe(Arc<Coordinator>);

impl Probe for CoordProbe {
    fn not_ready(&self) -> Option<&'static str> {
        if !self.0.is_serving() {
            return Some("not_serving");
        }
        (!self.0.has_learned()).then_some("learning_from_peers")
    }

    fn metrics(&self) -> String {
        self.0.metrics()
    }
}

/// The router of a coordinator's admin endpoints and status page; write endpoints need
/// `token` when it is `Some`.
pub fn router(coord: Arc<Coordinator>, token: Option<String>) -> Router {
    let page = || async { ([(CONTENT_TYPE, "text/html; charset=utf-8")], STATUS_PAGE) };
    let api = Router::new()
        .route("/", get(page))
        .route("/status", get(page))
        .route("/api/v1/servers", get(servers))
        .route("/api/v1/servers/{id}/drain", post(drain).delete(undrain))
        .route("/api/v1/apps", get(apps))
        .route("/api/v1/apps/{app}/shuffles", get(shuffles))
        .route("/api/v1/apps/{app}/shuffles/{id}", get(shuffle))
        .route("/api/v1/apps/{app}/unregister", post(unregister))
        .with_state(CoordApi { coord: coord.clone(), token: Token(token.map(Into::into)) });
    with_common(api, CoordProbe(coord))
}

fn address(a: &ServerAddr) -> String {
    format!("{}:{}", a.host, a.port)
}

fn member(s: &ServerSummary) -> api::Member {
    api::Member {
        server_id: s.addr.server_id.clone(),
        address: address(&s.addr),
        state: match s.state {
            ServerState::Live => api::MemberState::Live,
            ServerState::Draining => api::MemberState::Draining,
            ServerState::Lost => api::MemberState::Lost,
        },
        drain_pending: s.drain_pending.map(|m| match m {
            DrainMark::Drain => api::DrainPending::Drain,
            DrainMark::Undrain => api::DrainPending::Undrain,
        }),
        memory_budget_bytes: s.memory_budget_bytes,
        free_memory_bytes: s.free_memory_bytes,
        free_disk_bytes: s.free_disk_bytes,
        disk_capacity_bytes: s.disk_capacity_bytes,
        partitions_held: s.partitions_held,
        shuffles_held: s.shuffles_held,
        push_bytes_per_s: s.push_bytes_per_s,
        last_heartbeat_ms: s.last_heartbeat_ms,
        disks: s
            .disks
            .iter()
            .map(|d| api::Disk {
                path: d.path.clone(),
                free_bytes: d.free_bytes,
                capacity_bytes: d.capacity_bytes,
                state: match sluice_server::DiskState::from_wire(d.state) {
                    Some(sluice_server::DiskState::Full) => api::DiskState::Full,
                    Some(sluice_server::DiskState::Failed) => api::DiskState::Failed,
                    _ => api::DiskState::InService,
                },
            })
            .collect(),
    }
}

fn shuffle_json(s: ShuffleSummary) -> api::Shuffle {
    api::Shuffle {
        app_id: s.app_id,
        shuffle_id: s.shuffle_id,
        maps: s.maps,
        partitions: s.partitions,
        replication: s.replication,
        registered_ms: s.registered_ms,
        servers: s
            .servers
            .iter()
            .map(|a| api::ServerRef { server_id: a.server_id.clone(), address: address(a) })
            .collect(),
        assignment: s
            .placement
            .into_iter()
            .map(|p| api::Placement {
                partition: p.partition,
                primary: p.primary,
                replica: p.replica,
            })
            .collect(),
    }
}

async fn servers(State(s): State<CoordApi>) -> Json<api::Members> {
    Json(api::Members { servers: s.coord.servers_report().iter().map(member).collect() })
}

async fn apps(State(s): State<CoordApi>) -> Json<api::Apps> {
    let apps = s.coord.apps_report().into_iter().map(|a| api::App {
        app_id: a.app_id,
        shuffles: a.shuffles,
        last_heartbeat_ms: a.last_heartbeat_ms,
    });
    Json(api::Apps { apps: apps.collect() })
}

fn unknown_app(app: &str) -> Refusal {
    Refusal::not_found("unknown_app", format!("no application {app:?} is registered here"))
}

async fn shuffles(
    State(s): State<CoordApi>,
    Path(app): Path<String>,
) -> Result<Json<api::Shuffles>, Refusal> {
    let list = s.coord.shuffles_of(&app).ok_or_else(|| unknown_app(&app))?;
    Ok(Json(api::Shuffles { app_id: app, shuffles: list.into_iter().map(shuffle_json).collect() }))
}

async fn shuffle(
    State(s): State<CoordApi>,
    Path((app, id)): Path<(String, String)>,
) -> Result<Json<api::Shuffle>, Refusal> {
    let id: u32 = id.parse().map_err(|_| {
        Refusal::bad_request(format!("shuffle id {id:?} is not a number from 0 to 4294967295"))
    })?;
    match s.coord.shuffle(&app, id) {
        Some(sh) => Ok(Json(shuffle_json(sh))),
        None if s.coord.shuffles_of(&app).is_none() => Err(unknown_app(&app)),
        None => Err(Refusal::not_found(
            "unknown_shuffle",
            format!("application {app:?} has no shuffle {id} registered here"),
        )),
    }
}

/// The server `id` after `mark` (drain or undrain) was applied to it.
fn marked(
    s: &CoordApi,
    id: &str,
    body: &Bytes,
    mark: impl Fn(&Coordinator, &str) -> bool,
    what: &str,
) -> Result<Json<api::Member>, Refusal> {
    let why = action(body)?.reason.unwrap_or_default();
    if !mark(&s.coord, id) {
        return Err(Refusal::not_found(
            "unknown_server",
            format!("no server {id:?} has registered with this coordinator"),
        ));
    }
    tracing::info!(server = id, reason = %why, "{what} asked through the admin API");
    let report = s.coord.servers_report();
    let found = report.iter().find(|m| m.addr.server_id == id).map(member);
    // It was there a moment ago; servers are never forgotten.
    found.map(Json).ok_or_else(|| Refusal::not_found("unknown_server", id.to_owned()))
}

async fn drain(
    State(s): State<CoordApi>,
    Path(id): Path<String>,
    _: Authorized,
    body: Bytes,
) -> Result<Json<api::Member>, Refusal> {
    marked(&s, &id, &body, Coordinator::drain_server, "drain")
}

async fn undrain(
    State(s): State<CoordApi>,
    Path(id): Path<String>,
    _: Authorized,
    body: Bytes,
) -> Result<Json<api::Member>, Refusal> {
    marked(&s, &id, &body, Coordinator::undrain_server, "undrain")
}

async fn unregister(
    State(s): State<CoordApi>,
    Path(app): Path<String>,
    _: Authorized,
    body: Bytes,
) -> Result<impl IntoResponse, Refusal> {
    let why = action(&body)?.reason.unwrap_or_default();
    if !s.coord.unregister_app_everywhere(&app).await {
        return Err(unknown_app(&app));
    }
    tracing::info!(app = %app, reason = %why, "application unregistered through the admin API");
    Ok(Json(api::Unregistered { app_id: app }))
}
