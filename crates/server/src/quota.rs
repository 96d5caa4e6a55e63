//! Quotas: what one application, and one user's applications together, may hold on this server.
//!
//! Three kinds, each a limit in bytes (0: none), set per application by default and per user by
//! default, with per-user overrides (`[quotas]` in the server's configuration, [`QuotaConfig`]):
//! - `buffered_bytes`: push bodies held in the memory budget, counted from the moment memory is
//!   reserved for a body until the last slice of it is flushed;
//! - `disk_bytes`: bytes of the application's live shuffles accepted here: on disk, or buffered on
//!   their way there (every accepted byte ends up in a file); freed when a shuffle is deleted;
//! - `object_store_bytes`: bytes moved to the object-store tier ([`Quotas::moved_to_object_store`],
//!   called when a partition moves), which no longer count as `disk_bytes`.
//!
//! A push is checked at admission, before its body is read and before any memory is reserved for
//! it ([`Quotas::admit`]): an application over a quota (or whose user is) is refused with
//! `QUOTA_EXCEEDED`, naming the quota and its limit, and takes nothing from the shared budget, so
//! other applications' pushes are not slowed by it. The check is per server: each server counts
//! what it holds, so an application spread over N servers may hold up to N times a limit.
//!
//! Why here and not at the coordinator: the server is where the bytes are counted and where the
//! memory is taken, so it can refuse before taking it, on every push, at no extra round trip; a
//! coordinator would see usage only through heartbeats, a second late.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Deserialize;
use sluice_proto::message::{AtQuota, QUOTA_HOLDER_APP, QUOTA_HOLDER_USER};
use sluice_proto::ErrorCode;

use crate::core::Refusal;

/// Limits of one kind of holder, in bytes; 0: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Bytes of push bodies held in memory.
    pub buffered_bytes: u64,
    /// Bytes of live shuffles stored (on disk, or buffered on their way there).
    pub disk_bytes: u64,
    /// Bytes moved to the object-store tier.
    pub object_store_bytes: u64,
}

/// The `[quotas]` section of the server's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotaConfig {
    /// Limits of every application (`[quotas.app]`).
    pub app: Limits,
    /// Limits of every user's applications together (`[quotas.user]`).
    pub user: Limits,
    /// Per-user overrides of `user` (`[quotas.users.<name>]`); a field left out (0) means no
    /// limit for that user.
    pub users: HashMap<String, Limits>,
}

/// One quota kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `buffered_bytes`.
    Buffered = 0,
    /// `disk_bytes`.
    Disk = 1,
    /// `object_store_bytes`.
    ObjectStore = 2,
}

impl Kind {
    /// Every kind, in index order.
    pub const ALL: [Kind; 3] = [Kind::Buffered, Kind::Disk, Kind::ObjectStore];

    /// The kind's key in the configuration and in messages.
    pub fn key(self) -> &'static str {
        match self {
            Kind::Buffered => "buffered_bytes",
            Kind::Disk => "disk_bytes",
            Kind::ObjectStore => "object_store_bytes",
        }
    }

    fn limit(self, l: &Limits) -> u64 {
        match self {
            Kind::Buffered => l.buffered_bytes,
            Kind::Disk => l.disk_bytes,
            Kind::ObjectStore => l.object_store_bytes,
        }
    }
}

/// What an application, or a user's applications, hold now, and when a push of theirs was last
/// refused for each kind.
#[derive(Debug, Default)]
pub struct Usage {
    held: [AtomicU64; 3],
    /// Per kind: 0, or 1 + the milliseconds since [`Quotas`]' start when a push was last refused
    /// for it. Cleared for `disk_bytes` and `object_store_bytes` when bytes of the kind are freed.
    refused_at: [AtomicU64; 3],
}

impl Usage {
    /// Bytes held of `kind`.
    pub fn get(&self, kind: Kind) -> u64 {
        self.held[kind as usize].load(Ordering::Acquire)
    }

    fn add(&self, kind: Kind, bytes: u64) {
        self.held[kind as usize].fetch_add(bytes, Ordering::AcqRel);
    }

    fn sub(&self, kind: Kind, bytes: u64) {
        // Saturating: a release never takes a count below zero (a shuffle recovered at start
        // was never counted, say).
        let _ = self.held[kind as usize]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(bytes)));
        // Stored bytes freed (a shuffle deleted, moved to the store): a push refused before may
        // fit now. Buffered bytes are freed at every flush: their refusals age out instead.
        if kind != Kind::Buffered && bytes > 0 {
            self.refused_at[kind as usize].store(0, Ordering::Release);
        }
    }

    fn mark_refused(&self, kind: Kind, now_ms: u64) {
        self.refused_at[kind as usize].store(now_ms + 1, Ordering::Release);
    }

    /// Whether the holder is at its `limit` of `kind` (0: none): it holds that much, or a push of
    /// its was refused for the kind and nothing of it was freed since (`disk_bytes`,
    /// `object_store_bytes`), or within `window_ms` (`buffered_bytes`).
    fn at_limit(&self, kind: Kind, limit: u64, now_ms: u64, window_ms: u64) -> bool {
        if limit == 0 {
            return false;
        }
        let refused = self.refused_at[kind as usize].load(Ordering::Acquire);
        let recent = refused > 0
            && (kind != Kind::Buffered || now_ms.saturating_sub(refused - 1) <= window_ms);
        self.get(kind) >= limit || recent
    }
}

/// Where a push's bytes are counted: its application's usage and, when it has one, its user's.
#[derive(Debug, Clone)]
pub struct Charge {
    app: Arc<Usage>,
    user: Option<Arc<Usage>>,
}

impl Charge {
    fn each(&self) -> impl Iterator<Item = &Arc<Usage>> {
        std::iter::once(&self.app).chain(self.user.as_ref())
    }

    /// Counts `bytes` of `kind`.
    pub fn add(&self, kind: Kind, bytes: u64) {
        self.each().for_each(|u| u.add(kind, bytes));
    }

    /// Uncounts `bytes` of `kind`.
    pub fn sub(&self, kind: Kind, bytes: u64) {
        self.each().for_each(|u| u.sub(kind, bytes));
    }
}

/// Bytes buffered on behalf of an application: uncounted when dropped (with the memory
/// reservation that carries it, see `memory_budget`).
#[derive(Debug)]
pub struct BufferedCharge {
    charge: Charge,
    bytes: u64,
}

/// Disk bytes of an admitted push, counted from its admission so that pushes admitted together
/// are checked against each other; uncounted when dropped before the push is stored
/// ([`Quotas::accepted`] keeps them).
#[derive(Debug)]
pub struct DiskHold {
    charge: Charge,
    bytes: u64,
}

impl Drop for DiskHold {
    fn drop(&mut self) {
        // Not a release of stored bytes: a refusal for the quota stays in force.
        for u in self.charge.each() {
            let _ = u.held[Kind::Disk as usize].fetch_update(
                Ordering::AcqRel,
                Ordering::Acquire,
                |v| Some(v.saturating_sub(self.bytes)),
            );
        }
    }
}

impl BufferedCharge {
    /// A charge of nothing yet, to the same application and user.
    pub fn empty_like(&self) -> BufferedCharge {
        BufferedCharge { charge: self.charge.clone(), bytes: 0 }
    }

    /// Counts `bytes` more.
    pub fn grow(&mut self, bytes: u64) {
        self.charge.add(Kind::Buffered, bytes);
        self.bytes += bytes;
    }
}

impl Drop for BufferedCharge {
    fn drop(&mut self) {
        self.charge.sub(Kind::Buffered, self.bytes);
    }
}

#[derive(Debug, Default)]
struct AppEntry {
    user: String,
    usage: Arc<Usage>,
    /// Per shuffle: bytes accepted ([`Kind::Disk`]) and moved to the object store.
    shuffles: HashMap<u32, [u64; 2]>,
}

#[derive(Debug, Default)]
struct State {
    apps: HashMap<String, AppEntry>,
    users: HashMap<String, Arc<Usage>>,
}

/// Every application's and user's usage, and the limits.
#[derive(Debug)]
pub struct Quotas {
    config: QuotaConfig,
    /// The origin of the refusal times ([`Usage`]).
    epoch: Instant,
    state: Mutex<State>,
    /// Pushes refused, per holder (0: application, 1: user) and [`Kind`].
    refused: [[AtomicU64; 3]; 2],
}

impl Quotas {
    /// Quotas with `config`'s limits.
    pub fn new(config: QuotaConfig) -> Self {
        Quotas {
            config,
            epoch: Instant::now(),
            state: Mutex::default(),
            refused: Default::default(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// Whether any limit is set (when none is, nothing is refused, and the server sends no
    /// `QuotaReport`).
    pub fn any_limit(&self) -> bool {
        let set = |l: &Limits| Kind::ALL.iter().any(|k| k.limit(l) > 0);
        set(&self.config.app) || set(&self.config.user) || self.config.users.values().any(set)
    }

    /// Notes the user an application runs as (from `RegisterApp`; empty: none). The first
    /// non-empty user stays: an application does not change users.
    pub fn set_user(&self, app_id: &str, user: &str) {
        if user.is_empty() {
            return;
        }
        let mut s = self.state.lock();
        let State { apps, users } = &mut *s;
        let app = apps.entry(app_id.to_owned()).or_default();
        if !app.user.is_empty() {
            return;
        }
        app.user = user.to_owned();
        // What the application holds already counts for its user from now on.
        let u = users.entry(user.to_owned()).or_default();
        for k in Kind::ALL {
            u.add(k, app.usage.get(k));
        }
    }

    fn charge_of(state: &mut State, app_id: &str) -> Charge {
        let State { apps, users } = state;
        let app = apps.entry(app_id.to_owned()).or_default();
        let user = (!app.user.is_empty()).then(|| users.entry(app.user.clone()).or_default());
        Charge { app: app.usage.clone(), user: user.map(|u| u.clone()) }
    }

    /// The limits of user `user`.
    fn user_limits(&self, user: &str) -> Limits {
        self.config.users.get(user).copied().unwrap_or(self.config.user)
    }

    /// Checks a push of `footprint` bytes in memory and `body_len` bytes of data by `app_id`,
    /// before its body is read or memory reserved: `Ok` with the charge its buffered bytes are
    /// to be counted under ([`Self::buffered`]), or the refusal naming the first quota it
    /// would pass.
    pub fn admit(
        &self,
        app_id: &str,
        footprint: u64,
        body_len: u64,
    ) -> Result<(Charge, DiskHold), Refusal> {
        // Checked and counted under the lock: pushes admitted at once (a writer pipelines
        // them) cannot each fit alone and pass the quota together.
        let mut s = self.state.lock();
        let charge = Self::charge_of(&mut s, app_id);
        let user = s.apps.get(app_id).map(|a| a.user.clone()).unwrap_or_default();
        let hold = |charge: &Charge| {
            charge.add(Kind::Disk, body_len);
            DiskHold { charge: charge.clone(), bytes: body_len }
        };
        if !self.any_limit() {
            let held = hold(&charge);
            return Ok((charge, held));
        }
        let adding = |k: Kind| match k {
            Kind::Buffered => footprint,
            Kind::Disk => body_len,
            Kind::ObjectStore => 0,
        };
        let over = |usage: &Usage, limits: &Limits, k: Kind| {
            let limit = k.limit(limits);
            let now = usage.get(k);
            // Object store bytes are not added by a push: at the limit, no more pushes.
            let past = if k == Kind::ObjectStore { now >= limit } else { now + adding(k) > limit };
            (limit > 0 && past).then_some((limit, now))
        };
        for k in Kind::ALL {
            if let Some((limit, now)) = over(&charge.app, &self.config.app, k) {
                self.refused[0][k as usize].fetch_add(1, Ordering::Relaxed);
                charge.app.mark_refused(k, self.now_ms());
                return Err(Refusal::new(
                    ErrorCode::QuotaExceeded,
                    format!(
                        "application {app_id} is over its quota app.{}: limit {limit} bytes \
                         ({now} held, a push of {} more)",
                        k.key(),
                        adding(k)
                    ),
                ));
            }
            if let Some(u) = &charge.user {
                if let Some((limit, now)) = over(u, &self.user_limits(&user), k) {
                    self.refused[1][k as usize].fetch_add(1, Ordering::Relaxed);
                    u.mark_refused(k, self.now_ms());
                    return Err(Refusal::new(
                        ErrorCode::QuotaExceeded,
                        format!(
                            "user {user} (application {app_id}) is over its quota user.{}: \
                             limit {limit} bytes ({now} held by the user's applications, a push \
                             of {} more)",
                            k.key(),
                            adding(k)
                        ),
                    ));
                }
            }
        }
        let held = hold(&charge);
        drop(s);
        Ok((charge, held))
    }

    /// Counts `bytes` buffered under `charge` until the returned guard is dropped.
    pub fn buffered(charge: Charge, bytes: u64) -> BufferedCharge {
        charge.add(Kind::Buffered, bytes);
        BufferedCharge { charge, bytes }
    }

    /// Counts `bytes` of shuffle `shuffle_id` of `app_id` accepted (stored, or on their way):
    /// keeps what `held` counted since the push's admission, or counts them now.
    #[cfg(test)]
    pub fn accepted(&self, app_id: &str, shuffle_id: u32, bytes: u64, held: Option<DiskHold>) {
        self.accepted_unless_deleted(app_id, shuffle_id, bytes, held, || false);
    }

    /// [`Self::accepted`], unless `deleted` says (asked under the quotas' lock) that the
    /// shuffle was deleted meanwhile: a shuffle is marked deleted before its bytes are
    /// uncounted ([`Self::shuffle_deleted`], [`Self::app_removed`]), so bytes stored just
    /// before its deletion are either counted before they are uncounted with it or not counted
    /// at all — never left counted for a shuffle (or an application) that is gone.
    pub fn accepted_unless_deleted(
        &self,
        app_id: &str,
        shuffle_id: u32,
        bytes: u64,
        held: Option<DiskHold>,
        deleted: impl FnOnce() -> bool,
    ) {
        let mut s = self.state.lock();
        if deleted() {
            return; // `held` is dropped: what it counted is uncounted
        }
        let charge = Self::charge_of(&mut s, app_id);
        if let Some(a) = s.apps.get_mut(app_id) {
            a.shuffles.entry(shuffle_id).or_default()[0] += bytes;
        }
        match held {
            Some(mut h) if h.bytes == bytes => h.bytes = 0,
            _ => charge.add(Kind::Disk, bytes),
        }
    }

    /// The object-store tier's hook: `bytes` of a shuffle moved from local disk to the object
    /// store (they stop counting as `disk_bytes` and count as `object_store_bytes`), called
    /// when a partition's data is served from the store (`ServerState::offload_partition`).
    pub fn moved_to_object_store(&self, app_id: &str, shuffle_id: u32, bytes: u64) {
        let mut s = self.state.lock();
        let charge = Self::charge_of(&mut s, app_id);
        let Some(a) = s.apps.get_mut(app_id) else { return };
        let sh = a.shuffles.entry(shuffle_id).or_default();
        let moved = bytes.min(sh[0]);
        sh[0] -= moved;
        sh[1] += bytes;
        charge.sub(Kind::Disk, moved);
        charge.add(Kind::ObjectStore, bytes);
    }

    /// Uncounts a deleted shuffle's bytes.
    pub fn shuffle_deleted(&self, app_id: &str, shuffle_id: u32) {
        let mut s = self.state.lock();
        let charge = Self::charge_of(&mut s, app_id);
        let Some(a) = s.apps.get_mut(app_id) else { return };
        if let Some([disk, object]) = a.shuffles.remove(&shuffle_id) {
            charge.sub(Kind::Disk, disk);
            charge.sub(Kind::ObjectStore, object);
        }
    }

    /// Forgets a removed application (its shuffles were deleted: their bytes are uncounted).
    pub fn app_removed(&self, app_id: &str) {
        let ids: Vec<u32> = {
            let s = self.state.lock();
            s.apps.get(app_id).map(|a| a.shuffles.keys().copied().collect()).unwrap_or_default()
        };
        for id in ids {
            self.shuffle_deleted(app_id, id);
        }
        let mut s = self.state.lock();
        if let Some(a) = s.apps.remove(app_id) {
            // Buffered bytes still counted leave with their flushes (the guards hold the usage).
            if !a.user.is_empty() && !s.apps.values().any(|o| o.user == a.user) {
                s.users.remove(&a.user);
            }
        }
    }

    /// Every application and user at one of its quotas (see [`Usage`]): what the server reports
    /// to coordinators after each heartbeat (`QuotaReport`), so that they refuse the holders'
    /// new shuffles. `window` is how long a refusal for `buffered_bytes` counts: two heartbeat
    /// intervals, so that a refusal is in at least one report, whenever between two heartbeats
    /// it came, and an application pushing at the limit does not come and go between reports.
    pub fn at_quota(&self, window: Duration) -> Vec<AtQuota> {
        let (now, window_ms) = (self.now_ms(), window.as_millis() as u64);
        let s = self.state.lock();
        let mut out = Vec::new();
        let mut check = |holder: u8, name: &str, usage: &Usage, limits: &Limits| {
            for k in Kind::ALL {
                let limit = k.limit(limits);
                if usage.at_limit(k, limit, now, window_ms) {
                    out.push(AtQuota {
                        holder,
                        name: name.to_owned(),
                        quota: k.key().to_owned(),
                        limit_bytes: limit,
                        held_bytes: usage.get(k),
                    });
                }
            }
        };
        for (app_id, a) in &s.apps {
            check(QUOTA_HOLDER_APP, app_id, &a.usage, &self.config.app);
        }
        for (user, u) in &s.users {
            check(QUOTA_HOLDER_USER, user, u, &self.user_limits(user));
        }
        out.sort_by(|a, b| (a.holder, &a.name, &a.quota).cmp(&(b.holder, &b.name, &b.quota)));
        out
    }

    /// Usage of an application (`None`: unknown).
    #[cfg(test)]
    pub fn app_usage(&self, app_id: &str) -> Option<Arc<Usage>> {
        self.state.lock().apps.get(app_id).map(|a| a.usage.clone())
    }

    /// Usage of a user's applications together (`None`: unknown).
    #[cfg(test)]
    pub fn user_usage(&self, user: &str) -> Option<Arc<Usage>> {
        self.state.lock().users.get(user).cloned()
    }

    /// Pushes refused so far, as (`app.<kind>` or `user.<kind>`, count), every quota listed.
    pub fn refusals(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for (h, holder) in ["app", "user"].iter().enumerate() {
            for k in Kind::ALL {
                let n = self.refused[h][k as usize].load(Ordering::Relaxed);
                out.push((format!("{holder}.{}", k.key()), n));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(buffered: u64, disk: u64, object: u64) -> Limits {
        Limits { buffered_bytes: buffered, disk_bytes: disk, object_store_bytes: object }
    }

    #[test]
    fn no_limits_refuse_nothing() {
        let q = Quotas::new(QuotaConfig::default());
        let c = q.admit("a", u64::MAX / 4, u64::MAX / 4).unwrap().0;
        let _held = Quotas::buffered(c, 1 << 40);
        assert!(q.admit("a", 1 << 40, 1 << 40).is_ok());
    }

    #[test]
    fn pushes_admitted_together_cannot_pass_a_quota_together() {
        let q = Quotas::new(QuotaConfig { app: limits(0, 1000, 0), ..Default::default() });
        let (_, first) = q.admit("a", 1, 600).unwrap();
        let r = q.admit("a", 1, 600).unwrap_err();
        assert!(
            r.reason().contains("(600 held"),
            "the first push counts from admission: {}",
            r.reason()
        );
        drop(first); // never stored
        assert_eq!(q.app_usage("a").unwrap().get(Kind::Disk), 0);
        let (_, held) = q.admit("a", 1, 600).unwrap();
        q.accepted("a", 1, 600, Some(held));
        assert_eq!(q.app_usage("a").unwrap().get(Kind::Disk), 600, "stored: counted once");
        assert!(q.admit("a", 1, 600).is_err());
    }

    #[test]
    fn app_quotas_refuse_before_the_limit_is_passed_and_free_on_release() {
        let q = Quotas::new(QuotaConfig { app: limits(100, 1000, 0), ..Default::default() });
        let c = q.admit("a", 60, 60).unwrap().0;
        let held = Quotas::buffered(c, 60);
        let r = q.admit("a", 60, 10).unwrap_err();
        assert_eq!(r.code(), ErrorCode::QuotaExceeded);
        assert!(r.reason().contains("app.buffered_bytes: limit 100 bytes"), "{}", r.reason());
        assert!(q.admit("b", 60, 60).is_ok(), "another application has its own quota");
        drop(held);
        assert_eq!(q.app_usage("a").unwrap().get(Kind::Buffered), 0);
        assert!(q.admit("a", 60, 60).is_ok());
        q.accepted("a", 1, 950, None);
        let r = q.admit("a", 10, 60).unwrap_err();
        assert!(
            r.reason().contains("app.disk_bytes: limit 1000 bytes (950 held"),
            "{}",
            r.reason()
        );
        q.shuffle_deleted("a", 1);
        assert!(q.admit("a", 10, 60).is_ok(), "a deleted shuffle's bytes are freed");
        let refusals = q.refusals();
        assert!(refusals.contains(&("app.buffered_bytes".into(), 1)), "{refusals:?}");
        assert!(refusals.contains(&("app.disk_bytes".into(), 1)), "{refusals:?}");
    }

    #[test]
    fn bytes_stored_as_their_shuffle_is_deleted_are_not_left_counted() {
        let q = Quotas::new(QuotaConfig { app: limits(0, 1000, 0), ..Default::default() });
        q.set_user("a", "alice");
        q.set_user("b", "alice"); // alice's count outlives application a
        let (_, held) = q.admit("a", 10, 600).unwrap();
        // The application removed between the push's admission and its bytes' acceptance.
        q.app_removed("a");
        q.accepted_unless_deleted("a", 1, 600, Some(held), || true);
        assert_eq!(q.user_usage("alice").unwrap().get(Kind::Disk), 0, "left counted");
        assert!(q.app_usage("a").is_none_or(|u| u.get(Kind::Disk) == 0));
        // Accepted before the shuffle's deletion: counted, then uncounted with it.
        let (_, held) = q.admit("a", 10, 600).unwrap();
        q.accepted_unless_deleted("a", 2, 600, Some(held), || false);
        assert_eq!(q.app_usage("a").unwrap().get(Kind::Disk), 600);
        q.shuffle_deleted("a", 2);
        assert_eq!(q.app_usage("a").unwrap().get(Kind::Disk), 0);
        assert!(q.admit("a", 10, 1000).is_ok(), "nothing left counted against the quota");
    }

    #[test]
    fn a_user_quota_is_shared_by_the_users_applications_and_overridable() {
        let mut users = HashMap::new();
        users.insert("big".to_owned(), limits(0, 10_000, 0));
        let q = Quotas::new(QuotaConfig { user: limits(0, 1000, 0), users, ..Default::default() });
        q.accepted("a1", 0, 300, None); // counted before its user was known: joins the user's count
        q.set_user("a1", "alice");
        q.set_user("a2", "alice");
        q.set_user("a1", "mallory"); // ignored: the first user stays
        q.accepted("a2", 0, 600, None);
        assert_eq!(q.user_usage("alice").unwrap().get(Kind::Disk), 900);
        let r = q.admit("a2", 1, 200).unwrap_err();
        assert!(r.reason().contains("user alice"), "{}", r.reason());
        assert!(r.reason().contains("user.disk_bytes: limit 1000 bytes"), "{}", r.reason());
        assert!(q.admit("a1", 1, 200).is_err(), "the other application of the user too");
        assert!(q.admit("b", 1, 200).is_ok(), "no user: no user quota");
        q.set_user("c", "big");
        q.accepted("c", 0, 5000, None);
        assert!(q.admit("c", 1, 200).is_ok(), "an override raises the user's limit");
        q.app_removed("a1");
        assert_eq!(q.user_usage("alice").unwrap().get(Kind::Disk), 600);
        assert!(q.admit("a2", 1, 200).is_ok());
    }

    #[test]
    fn object_store_bytes_move_out_of_disk_and_are_limited() {
        let q = Quotas::new(QuotaConfig { app: limits(0, 1000, 500), ..Default::default() });
        q.accepted("a", 3, 900, None);
        q.moved_to_object_store("a", 3, 500);
        let u = q.app_usage("a").unwrap();
        assert_eq!((u.get(Kind::Disk), u.get(Kind::ObjectStore)), (400, 500));
        let r = q.admit("a", 1, 1).unwrap_err();
        assert!(r.reason().contains("app.object_store_bytes: limit 500"), "{}", r.reason());
        q.shuffle_deleted("a", 3);
        assert_eq!((u.get(Kind::Disk), u.get(Kind::ObjectStore)), (0, 0));
        assert!(q.admit("a", 1, 1).is_ok());
    }

    #[test]
    fn who_is_at_quota_is_reported_until_space_is_freed_or_a_buffered_refusal_ages() {
        let q = Quotas::new(QuotaConfig {
            app: limits(100, 1000, 0),
            user: limits(0, 5000, 0),
            ..Default::default()
        });
        let window = Duration::from_millis(100);
        q.set_user("a", "alice");
        q.accepted("a", 1, 900, None);
        assert!(q.at_quota(window).is_empty(), "below every limit, nothing refused");
        // A push that would pass app.disk_bytes: refused, and the app is reported from then on,
        // with what it holds, though it holds less than the limit.
        assert!(q.admit("a", 1, 200).is_err());
        let names = |v: &[AtQuota]| {
            v.iter().map(|a| (a.holder, a.name.clone(), a.quota.clone())).collect::<Vec<_>>()
        };
        let r = q.at_quota(window);
        assert_eq!(names(&r), [(QUOTA_HOLDER_APP, "a".to_owned(), "disk_bytes".to_owned())]);
        assert_eq!((r[0].limit_bytes, r[0].held_bytes), (1000, 900));
        std::thread::sleep(window * 2);
        assert_eq!(q.at_quota(window).len(), 1, "a disk refusal stays until space is freed");
        q.shuffle_deleted("a", 1);
        assert!(q.at_quota(window).is_empty(), "freed: no longer at quota");
        // Usage at the limit is at quota without any refusal; a user's too.
        q.accepted("a", 2, 1000, None);
        q.accepted("b", 2, 10, None);
        q.set_user("b", "alice");
        q.accepted("b", 3, 4000, None);
        assert_eq!(
            names(&q.at_quota(window)),
            [
                (QUOTA_HOLDER_APP, "a".to_owned(), "disk_bytes".to_owned()),
                (QUOTA_HOLDER_APP, "b".to_owned(), "disk_bytes".to_owned()),
                (QUOTA_HOLDER_USER, "alice".to_owned(), "disk_bytes".to_owned()),
            ]
        );
        q.app_removed("a");
        q.app_removed("b");
        assert!(q.at_quota(window).is_empty());
        // A buffered refusal counts for the window only (buffered bytes come and go).
        let c = q.admit("c", 60, 1).unwrap().0;
        let _held = Quotas::buffered(c, 60);
        assert!(q.admit("c", 60, 1).is_err());
        assert_eq!(q.at_quota(window)[0].quota, "buffered_bytes");
        std::thread::sleep(window * 2);
        assert!(q.at_quota(window).is_empty(), "the buffered refusal aged out");
    }
}
