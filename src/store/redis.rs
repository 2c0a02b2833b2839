//! The cluster's store on Redis: every decision one Lua script (`lua/`, each prefixed with
//! `lua/common.lua`), run atomically by Redis; replicas and nodes never read-modify-write.
//! Times come from Redis's clock (`TIME`), so clocks of replicas and nodes need not agree.
//!
//! One multiplexed connection (reconnecting) carries the calls; grants wait on a second one
//! (`BLPOP` blocks its connection). With Sentinels (`cluster.sentinels`), both go to the master
//! the Sentinels name, asked again after a call fails for want of it (a failover moved it).

use std::str::FromStr;
use std::time::Duration;

use omni_actors::domain::Mode;
use omni_actors::edge::coordinator::{
    Beat, ClusterError, ClusterFuture, ClusterView, Coordinator, Enqueued, Grant, NodeBeat, NodeStore, Offer, Offered,
    Reported, SlotReport, SlotState, SlotView, TicketView,
};
use omni_actors::ids::TicketId;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, ErrorKind, Script, ServerErrorKind};
use std::sync::{Arc, Weak};
use tokio::sync::Mutex;

macro_rules! script {
    ($file:literal) => {
        Script::new(concat!(include_str!("lua/common.lua"), "\n", include_str!(concat!("lua/", $file))))
    };
}

struct Scripts {
    enqueue: Script,
    offer: Script,
    claim: Script,
    leave: Script,
    requeue: Script,
    cancel: Script,
    gw_beat: Script,
    node_beat: Script,
    snapshot: Script,
}

impl Scripts {
    fn new() -> Scripts {
        Scripts {
            enqueue: script!("enqueue.lua"),
            offer: script!("offer.lua"),
            claim: script!("claim.lua"),
            leave: script!("leave.lua"),
            requeue: script!("requeue.lua"),
            cancel: script!("cancel.lua"),
            gw_beat: script!("gw_beat.lua"),
            node_beat: script!("node_beat.lua"),
            snapshot: script!("snapshot.lua"),
        }
    }
}

/// How long a call to Redis may take before it counts as failed (a paused or lost store).
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(800);

/// Where the store is: one server, or the master a set of Sentinels names now.
enum Target {
    Direct(redis::Client),
    Sentinel(Mutex<SentinelClient>),
}

/// A connection to the store, for a replica or a node. Cheap to share (`Arc`).
pub struct RedisStore {
    target: Target,
    /// Every key's prefix, with its hash tag: `{og}`.
    prefix: String,
    /// This process's name in the store.
    name: String,
    lease: Duration,
    /// Made on first use; made anew (the master asked again) when it fails with Sentinels.
    calls: parking_lot::Mutex<Option<ConnectionManager>>,
    blocking: Mutex<Option<MultiplexedConnection>>,
    scripts: Scripts,
    /// Itself, for the futures of [`Coordinator`] calls (they outlive `&self`).
    me: Weak<RedisStore>,
}

/// What `snapshot.lua` answers: version, Redis's time (ms), slots (flattened), ema.
type ViewRest = (String, String, Vec<String>, Vec<String>);

/// The Sentinels' client when the store's TLS has a private CA (`redis_ca`): the Sentinels and
/// the master they name are both verified against it. The Sentinels share one password and one
/// TLS mode here (the first that names a password gives it; TLS if any is `rediss://`).
fn sentinels_with_ca(
    sentinels: &[String],
    master: &str,
    info: &redis::ConnectionInfo,
    tcp: redis::io::tcp::TcpSettings,
    certs: impl Fn() -> redis::TlsCertificates,
) -> Result<SentinelClient, StoreError> {
    let mut addresses = Vec::new();
    let (mut password, mut tls) = (None, false);
    for a in sentinels {
        let sentinel =
            redis::IntoConnectionInfo::into_connection_info(sentinel_url(a).as_str()).map_err(StoreError::Sentinels)?;
        password = password.or_else(|| sentinel.redis_settings().password().map(str::to_string));
        let address = match sentinel.addr() {
            redis::ConnectionAddr::Tcp(host, port) => redis::ConnectionAddr::Tcp(host.clone(), *port),
            redis::ConnectionAddr::TcpTls { host, port, .. } => {
                tls = true;
                // Verified, against the CA set below.
                redis::ConnectionAddr::TcpTls { host: host.clone(), port: *port, insecure: false, tls_params: None }
            }
            other => {
                return Err(StoreError::Sentinels(redis::RedisError::from(std::io::Error::other(format!(
                    "a Sentinel at {other} is not reached over TCP"
                )))));
            }
        };
        addresses.push(address);
    }
    let store = info.redis_settings();
    let mut builder = redis::sentinel::SentinelClientBuilder::new(addresses, master, SentinelServerType::Master)
        .map_err(StoreError::Sentinels)?
        .set_client_to_redis_db(store.db())
        .set_client_to_redis_tcp_settings(tcp.clone())
        .set_client_to_sentinel_tcp_settings(tcp);
    if let Some(user) = store.username() {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(pw) = store.password() {
        builder = builder.set_client_to_redis_password(pw);
    }
    if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
        builder =
            builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure).set_client_to_redis_certificates(certs());
    }
    if let Some(pw) = password {
        builder = builder.set_client_to_sentinel_password(pw);
    }
    if tls {
        builder = builder
            .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure)
            .set_client_to_sentinel_certificates(certs());
    }
    builder.build().map_err(StoreError::Sentinels)
}

/// A Sentinel's address as the crate takes it: `HOST:PORT`, or a URL with its password or TLS
/// (`redis://:PASSWORD@HOST:PORT`, `rediss://HOST:PORT`).
fn sentinel_url(address: &str) -> String {
    if address.contains("://") { address.to_string() } else { format!("redis://{address}") }
}

fn store_error(e: redis::RedisError) -> ClusterError {
    ClusterError::Unreachable(e.to_string())
}

fn bad(what: &str) -> ClusterError {
    ClusterError::Unexpected(format!("answer to {what}"))
}

fn mode(s: &str) -> Result<Mode, ClusterError> {
    Mode::from_str(s).map_err(|_| ClusterError::Unexpected(format!("mode '{s}' in the store")))
}

fn ticket(s: &str) -> Result<TicketId, ClusterError> {
    s.parse().map_err(|_| ClusterError::Unexpected(format!("ticket number '{s}' in the store")))
}

/// The longest grant field a node writes (a slot's `node/worker`, a `HOST:PORT`, a nonce, a
/// signature): a longer one is not a node's, and is clipped to this (its signature then does
/// not check, and the grant is refused like any forged one, at no more cost than a real one).
const MAX_GRANT_FIELD: usize = 300;

fn clipped(field: &str) -> String {
    let mut end = field.len().min(MAX_GRANT_FIELD);
    while !field.is_char_boundary(end) {
        end -= 1;
    }
    field[..end].to_string()
}

/// A grant as the scripts write it: `seq slot addr nonce mode sig`.
fn grant(fields: &[String]) -> Result<Grant, ClusterError> {
    match fields {
        [seq, slot, addr, nonce, m, sig] => Ok(Grant {
            ticket: ticket(seq)?,
            slot: clipped(slot),
            addr: clipped(addr),
            nonce: clipped(nonce),
            mode: mode(m)?,
            sig: clipped(sig),
        }),
        _ => Err(bad("a grant")),
    }
}

/// Why a store could not be set up (no connection is made yet: these are its addresses).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cluster.url: {0}")]
    Url(redis::RedisError),
    #[error("cluster.sentinels: {0}")]
    Sentinels(redis::RedisError),
    #[error("cluster.redis_ca {path}: {why}")]
    Ca { path: std::path::PathBuf, why: String },
}

impl RedisStore {
    /// `url`: `redis://[:password@]host:port/db` or `rediss://` (TLS). Connects lazily.
    pub fn new(url: &str, prefix: &str, name: String, lease: Duration) -> Result<Arc<RedisStore>, StoreError> {
        RedisStore::open(url, &[], "", None, prefix, name, lease)
    }

    /// The store of a `[cluster]` section: at `url`, or, with `sentinels`, at the master they
    /// name `sentinel_master` (`url` then gives only the password, database and TLS).
    pub fn from_spec(spec: &crate::store::ClusterSpec) -> Result<Arc<RedisStore>, StoreError> {
        let ca = spec.redis_ca.as_deref();
        RedisStore::open(
            &spec.url,
            &spec.sentinels,
            &spec.sentinel_master,
            ca,
            &spec.prefix,
            spec.name.clone(),
            spec.lease,
        )
    }

    fn open(
        url: &str,
        sentinels: &[String],
        master: &str,
        ca: Option<&std::path::Path>,
        prefix: &str,
        name: String,
        lease: Duration,
    ) -> Result<Arc<RedisStore>, StoreError> {
        if url.starts_with("rediss://") || sentinels.iter().any(|a| a.starts_with("rediss://")) {
            // TLS through rustls, with the provider the rest of the server uses.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        // Small commands answered at once: without TCP_NODELAY one written while the previous is
        // unacknowledged waits for the delayed ACK (tens of milliseconds in the hand-over).
        let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(StoreError::Url)?;
        let tcp = info.tcp_settings().clone().set_nodelay(true);
        let target = if let Some(path) = ca {
            // The store's (and the Sentinels') certificates are verified against this CA only.
            let bad = |why: String| StoreError::Ca { path: path.to_path_buf(), why };
            let root_cert = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
            let certs = || redis::TlsCertificates { client_tls: None, root_cert: Some(root_cert.clone()) };
            if sentinels.is_empty() {
                let client = redis::Client::build_with_tls(info.set_tcp_settings(tcp), certs())
                    .map_err(|e| bad(e.to_string()))?;
                Target::Direct(client)
            } else {
                Target::Sentinel(Mutex::new(sentinels_with_ca(sentinels, master, &info, tcp, certs)?))
            }
        } else if sentinels.is_empty() {
            Target::Direct(redis::Client::open(info.set_tcp_settings(tcp)).map_err(StoreError::Url)?)
        } else {
            let mut node = SentinelNodeConnectionInfo::default()
                .set_redis_connection_info(info.redis_settings().clone())
                .set_tcp_settings(tcp);
            if url.starts_with("rediss://") {
                node = node.set_tls_mode(redis::TlsMode::Secure);
            }
            let addresses: Vec<String> = sentinels.iter().map(|a| sentinel_url(a)).collect();
            let client = SentinelClient::build(addresses, master, Some(node), SentinelServerType::Master)
                .map_err(StoreError::Sentinels)?;
            Target::Sentinel(Mutex::new(client))
        };
        Ok(Arc::new_cyclic(|me| RedisStore {
            target,
            prefix: format!("{{{prefix}}}"),
            name,
            lease,
            calls: parking_lot::Mutex::new(None),
            blocking: Mutex::new(None),
            scripts: Scripts::new(),
            me: me.clone(),
        }))
    }

    /// A client for the store's master: the one address, or the one the Sentinels name now.
    async fn client(&self) -> Result<redis::Client, ClusterError> {
        match &self.target {
            Target::Direct(client) => Ok(client.clone()),
            Target::Sentinel(sentinels) => {
                sentinels.lock().await.async_get_client().await.map_err(|e| ClusterError::NoMaster(e.to_string()))
            }
        }
    }

    /// A failed call's error. With Sentinels, one that may mean the master moved (it is gone,
    /// or it is a replica now) makes the next call ask them again.
    fn failed(&self, e: redis::RedisError) -> ClusterError {
        let moved = e.is_io_error()
            || e.is_connection_refusal()
            || e.is_connection_dropped()
            || e.is_timeout()
            || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly);
        if moved && matches!(self.target, Target::Sentinel(_)) && self.calls.lock().take().is_some() {
            log::warn!("cluster: the store's master failed ({e}); asking the Sentinels again");
        }
        store_error(e)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    async fn calls(&self) -> Result<ConnectionManager, ClusterError> {
        if let Some(manager) = self.calls.lock().as_ref() {
            return Ok(manager.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let manager = ConnectionManager::new_lazy_with_config(self.client().await?, config).map_err(store_error)?;
        Ok(self.calls.lock().get_or_insert(manager).clone())
    }

    async fn run<T: redis::FromRedisValue>(&self, script: &Script, args: &[&str]) -> Result<T, ClusterError> {
        let mut con = self.calls().await?;
        let mut call = script.key(&self.prefix);
        for a in args {
            call.arg(*a);
        }
        call.invoke_async(&mut con).await.map_err(|e| self.failed(e))
    }

    /// What a view reads, at one instant (MULTI): every ticket's info (`P:tinfo`, whose
    /// fields are exactly the tickets in `P:q`) by a plain `HGETALL`, and the rest by
    /// `snapshot.lua`. Thousands of tickets cost Redis a third of what the same read through
    /// Lua did (0.7 against 2.0 to 2.5 ms with 2,000 waiting), and Redis runs nothing else
    /// meanwhile: an offer waiting behind a view waits less.
    async fn read_view(&self) -> Result<(Vec<(String, String)>, ViewRest), ClusterError> {
        let mut con = self.calls().await?;
        let script = &self.scripts.snapshot;
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HGETALL")
            .arg(format!("{}:tinfo", self.prefix))
            .cmd("EVALSHA")
            .arg(script.get_hash())
            .arg(1)
            .arg(&self.prefix);
        match pipe.query_async(&mut con).await {
            // Redis restarted since the script was loaded (or never ran it): load it, again.
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                script.load_async(&mut con).await.map_err(|e| self.failed(e))?;
                pipe.query_async(&mut con).await.map_err(|e| self.failed(e))
            }
            answer => answer.map_err(|e| self.failed(e)),
        }
    }

    /// Connects and asks the store for a PING within `within`: what `check-config` tells an
    /// operator (unreachable, a wrong password, a certificate not trusted), with the URL
    /// redacted by the caller.
    pub async fn ping(&self, within: Duration) -> Result<(), ClusterError> {
        let config =
            AsyncConnectionConfig::new().set_connection_timeout(Some(within)).set_response_timeout(Some(within));
        let attempt = async {
            let mut con = self
                .client()
                .await?
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(store_error)?;
            redis::cmd("PING").query_async::<String>(&mut con).await.map(drop).map_err(store_error)
        };
        tokio::time::timeout(within + within, attempt)
            .await
            .unwrap_or_else(|_| Err(ClusterError::Unreachable(format!("no answer within {} s", within.as_secs_f64()))))
    }

    async fn blocking_connection(&self, wait: Duration) -> Result<MultiplexedConnection, ClusterError> {
        let mut held = self.blocking.lock().await;
        if let Some(con) = held.as_ref() {
            return Ok(con.clone());
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(RESPONSE_TIMEOUT))
            .set_response_timeout(Some(wait + RESPONSE_TIMEOUT));
        let con = self
            .client()
            .await?
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| self.failed(e))?;
        *held = Some(con.clone());
        Ok(con)
    }
}

fn modes_csv(modes: &[Mode]) -> String {
    modes.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(",")
}

impl NodeStore for RedisStore {
    fn node(&self) -> &str {
        &self.name
    }

    fn offer(&self, offer: Offer) -> ClusterFuture<Offered> {
        let this = self.handle();
        Box::pin(async move {
            let (ended_mode, secs) = match offer.ended {
                Some((m, d)) => (m.as_str().to_string(), format!("{:.3}", d.as_secs_f64())),
                None => (String::new(), String::new()),
            };
            let (modes, linked) = (modes_csv(&offer.modes), offer.linked.join(","));
            let args =
                [&this.name, &offer.slot, &offer.nonce, &modes, &offer.addr, &ended_mode, &secs, &linked, &offer.sig];
            let answer: Vec<String> = this.run(&this.scripts.offer, &args.map(String::as_str)).await?;
            match (answer.first().map(String::as_str), answer.get(1)) {
                (Some("assigned"), Some(seq)) => {
                    let push = match (answer.get(2), answer.get(3)) {
                        (Some(replica), Some(m)) => Some((replica.clone(), mode(m)?)),
                        _ => None,
                    };
                    Ok(Offered::Assigned { ticket: ticket(seq)?, push })
                }
                (Some("free"), _) => Ok(Offered::Free),
                (Some("unknown_node"), _) => Ok(Offered::UnknownNode),
                _ => Err(bad("offer")),
            }
        })
    }

    fn node_beat(&self, addr: &str, attach_timeout: Duration, reports: &[SlotReport]) -> ClusterFuture<NodeBeat> {
        let this = self.handle();
        let lease = self.lease.as_millis().to_string();
        let deadline = attach_timeout.as_millis().to_string();
        let mut args: Vec<String> = vec![self.name.clone(), addr.to_string(), lease, deadline];
        for r in reports {
            let (state, tag) = match &r.state {
                Reported::Busy(ticket) => ("busy", ticket.to_string()),
                Reported::Down => ("down", String::new()),
                Reported::Offered(nonce) => ("offered", nonce.clone()),
                Reported::Pending => ("pending", String::new()),
            };
            args.extend([r.slot.clone(), state.to_string(), modes_csv(&r.modes), tag]);
        }
        Box::pin(async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (known, again): (i64, Vec<String>) = this.run(&this.scripts.node_beat, &args).await?;
            Ok(NodeBeat { known: known == 1, again })
        })
    }

    fn deliver(&self, replica: &str, g: &Grant) -> ClusterFuture<()> {
        let this = self.handle();
        let list = format!("{}:g:{replica}", self.prefix);
        let grant = format!("{} {} {} {} {} {}", g.ticket, g.slot, g.addr, g.nonce, g.mode.as_str(), g.sig);
        Box::pin(async move {
            let mut con = this.calls().await?;
            let _: i64 =
                redis::cmd("RPUSH").arg(list).arg(grant).query_async(&mut con).await.map_err(|e| this.failed(e))?;
            Ok(())
        })
    }
}

impl Coordinator for RedisStore {
    fn replica(&self) -> &str {
        &self.name
    }

    fn beat(&self) -> ClusterFuture<Beat> {
        let this = self.handle();
        Box::pin(async move {
            let lease = this.lease.as_millis().to_string();
            let (known, cancelled): (i64, Vec<String>) = this.run(&this.scripts.gw_beat, &[&this.name, &lease]).await?;
            let cancelled = cancelled.iter().map(|t| ticket(t)).collect::<Result<_, _>>()?;
            Ok(Beat { known: known == 1, cancelled })
        })
    }

    fn enqueue(&self, m: Mode, given: Option<TicketId>, max_waiting: usize) -> ClusterFuture<Enqueued> {
        let this = self.handle();
        Box::pin(async move {
            let given = given.map(|t| t.to_string()).unwrap_or_default();
            let max = max_waiting.to_string();
            let answer: Vec<String> = this.run(&this.scripts.enqueue, &[&this.name, m.as_str(), &given, &max]).await?;
            let number = |i: usize| -> Result<usize, ClusterError> {
                answer.get(i).and_then(|s| s.parse().ok()).ok_or_else(|| bad("enqueue"))
            };
            match answer.first().map(String::as_str) {
                Some("granted") => Ok(Enqueued::Granted(grant(&answer[1..])?)),
                Some("waiting") => Ok(Enqueued::Waiting {
                    ticket: ticket(answer.get(1).ok_or_else(|| bad("enqueue"))?)?,
                    position: number(2)?,
                    length: number(3)?,
                }),
                Some("full") => Ok(Enqueued::Full { length: number(1)? }),
                Some("unavailable") => Ok(Enqueued::Unavailable),
                Some("unknown_gateway") => Ok(Enqueued::UnknownReplica),
                _ => Err(bad("enqueue")),
            }
        })
    }

    fn claim(&self, t: TicketId) -> ClusterFuture<()> {
        let this = self.handle();
        Box::pin(async move {
            let _: i64 = this.run(&this.scripts.claim, &[&t.to_string()]).await?;
            Ok(())
        })
    }

    fn leave(&self, t: TicketId) -> ClusterFuture<bool> {
        let this = self.handle();
        Box::pin(async move {
            let waited: i64 = this.run(&this.scripts.leave, &[&t.to_string()]).await?;
            Ok(waited == 1)
        })
    }

    fn requeue(&self, g: &Grant) -> ClusterFuture<bool> {
        let this = self.handle();
        let (t, nonce) = (g.ticket.to_string(), g.nonce.clone());
        Box::pin(async move {
            let done: i64 = this.run(&this.scripts.requeue, &[&t, &nonce]).await?;
            Ok(done == 1)
        })
    }

    fn cancel(&self, t: TicketId) -> ClusterFuture<bool> {
        let this = self.handle();
        Box::pin(async move {
            let done: i64 = this.run(&this.scripts.cancel, &[&t.to_string()]).await?;
            Ok(done == 1)
        })
    }

    fn version(&self) -> ClusterFuture<u64> {
        let this = self.handle();
        Box::pin(async move {
            let mut con = this.calls().await?;
            let version: Option<u64> = redis::cmd("GET")
                .arg(format!("{}:ver", this.prefix))
                .query_async(&mut con)
                .await
                .map_err(|e| this.failed(e))?;
            Ok(version.unwrap_or(0))
        })
    }

    fn snapshot(&self) -> ClusterFuture<ClusterView> {
        let this = self.handle();
        Box::pin(async move {
            let (infos, (version, now, slots, ema)) = this.read_view().await?;
            let mut view = ClusterView {
                version: version.parse().map_err(|_| bad("snapshot"))?,
                now_ms: now.parse().map_err(|_| bad("snapshot"))?,
                ..ClusterView::default()
            };
            for (seq, info) in &infos {
                let mut fields = info.split(' ');
                let (Some(m), Some(replica), Some(state)) = (fields.next(), fields.next(), fields.next()) else {
                    continue; // not as the scripts write it (`tinfo` in lua/common.lua): never
                };
                view.tickets.push(TicketView {
                    ticket: ticket(seq)?,
                    mode: mode(m)?,
                    replica: replica.to_string(),
                    granted: state == "assigned",
                });
            }
            // Tickets are numbered in queue order (`P:q` is scored by the number).
            view.tickets.sort_unstable_by_key(|t| t.ticket);
            for s in slots.chunks_exact(6) {
                let modes = s[2].split(',').filter(|m| !m.is_empty()).map(mode).collect::<Result<Vec<_>, _>>()?;
                let busy = match (s[3].as_str(), s[4].as_str()) {
                    ("busy", m) if !m.is_empty() => Some((mode(m)?, s[5].parse().unwrap_or(view.now_ms))),
                    _ => None,
                };
                let state = SlotState::parse(&s[3]);
                view.slots.push(SlotView { slot: s[0].clone(), node: s[1].clone(), modes, state, busy });
            }
            for (i, e) in ema.iter().take(3).enumerate() {
                view.average_s[i] = e.parse().ok();
            }
            Ok(view)
        })
    }

    fn grants(&self, wait: Duration) -> ClusterFuture<Vec<Grant>> {
        let this = self.handle();
        Box::pin(async move {
            let mut con = this.blocking_connection(wait).await?;
            let list = format!("{}:g:{}", this.prefix, this.name);
            let secs = wait.as_secs_f64().max(0.01);
            let popped: Option<(String, String)> =
                match redis::cmd("BLPOP").arg(&list).arg(secs).query_async(&mut con).await {
                    Ok(popped) => popped,
                    Err(e) => {
                        // A broken blocking connection is made anew next time.
                        *this.blocking.lock().await = None;
                        return Err(this.failed(e));
                    }
                };
            let Some((_, first)) = popped else { return Ok(Vec::new()) };
            let fields: Vec<String> = first.split(' ').map(str::to_string).collect();
            Ok(vec![grant(&fields)?])
        })
    }
}

impl RedisStore {
    /// The store itself, for a future that outlives the borrow of `self`.
    fn handle(&self) -> Arc<RedisStore> {
        self.me.upgrade().expect("a RedisStore lives in an Arc (RedisStore::new)")
    }
}
