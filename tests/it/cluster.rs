//! Replicas sharing one queue and one pool on Redis (`[cluster] engine = "redis"`): three
//! gateway replicas and their nodes on loopback, with Debian's redis-server started by the
//! test, and faults injected (SIGKILL, SIGSTOP/SIGCONT, a Redis restart). The invariants are
//! checked from the nodes' own logs of who held each worker when.
//!
//! They need redis-server: skipped without it by a plain `cargo test`, a failure under
//! `./test.sh`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{Value, json};

/// The cluster section of a replica (`replica`) or a node, with leases short enough for tests.
fn cluster(redis: &Redis, name: &str, replica: bool) -> String {
    cluster_at(&redis.url(), name, replica)
}

fn cluster_at(url: &str, name: &str, replica: bool) -> String {
    let credential = if replica {
        format!("credential = \"{}\"\n", omni_backend_host::link::replica::issue(NODE_TOKEN, name))
    } else {
        String::new()
    };
    format!(
        "[cluster]\nengine = \"redis\"\nurl = \"{url}\"\nname = \"{name}\"\nlease_s = 1.0\nattach_timeout_s = 1.0\n{credential}"
    )
}

/// A node named `name` with `count` workers, in the cluster: started, and its workers known
/// to the store (so that a client arriving next is not told no worker serves its mode).
fn node(redis: &Redis, name: &str, count: usize) -> Node {
    let node = Node::start(&format!("{}\n{}", workers(count, ""), cluster(redis, name, false)), "");
    registered(redis, &node, name, count);
    node
}

/// Waits until the store knows node `name`'s `count` workers.
fn registered(redis: &Redis, node: &Node, name: &str, count: usize) {
    let deadline = Instant::now() + WAIT;
    for i in 0..count {
        while redis.command(&format!("SISMEMBER {{og}}:cap:audio {name}/sim-{i}")).as_deref() != Some(":1\r\n") {
            assert!(Instant::now() < deadline, "node {name}'s worker sim-{i} never registered:\n{}", node.logs());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Waits until the store has forgotten replica `name` (its lease ran out and another replica's
/// beat removed it, with its tickets).
async fn forgotten(redis: &Redis, name: &str) {
    let deadline = Instant::now() + WAIT;
    while redis.command(&format!("ZSCORE {{og}}:gw {name}")).as_deref() != Some("$-1\r\n") {
        assert!(Instant::now() < deadline, "the store never forgot replica {name}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A replica named `name`: no workers of its own.
fn replica(redis: &Redis, name: &str) -> Server {
    replica_at(&redis.url(), name)
}

fn replica_at(url: &str, name: &str) -> Server {
    Server::start(
        Setup::default().workers(String::new()).queue("update_interval_s = 1.0").extra(&cluster_at(url, name, true)),
    )
}

/// Redis, a node `n1` with one worker, and two replicas `g1` and `g2`.
fn two_replicas() -> (Redis, Node, Server, Server) {
    let redis = Redis::start();
    let n1 = node(&redis, "n1", 1);
    let (g1, g2) = (replica(&redis, "g1"), replica(&redis, "g2"));
    (redis, n1, g1, g2)
}

/// A client waiting in the queue: the positions it was told, in order.
struct Waiter {
    client: Client,
    positions: Vec<u64>,
    ticket: String,
}

impl Waiter {
    /// Connects in audio mode and expects to wait.
    async fn join(server: &Server) -> Waiter {
        let mut client = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
        let queued = client.event().await;
        assert_eq!(queued["type"], "session.queued", "{queued}");
        let position = queued["position"].as_u64().unwrap();
        let ticket = queued["ticket_id"].as_str().unwrap().to_string();
        Waiter { client, positions: vec![position], ticket }
    }

    /// Reads queue updates until its position is `position`.
    async fn until_position(&mut self, position: u64) {
        while *self.positions.last().unwrap() != position {
            let e = self.client.event().await;
            assert_eq!(e["type"], "session.queue_update", "waiting for position {position}: {e}");
            self.update(&e);
        }
    }

    /// A queue update: the same ticket (its place kept), maybe a new position.
    fn update(&mut self, e: &Value) {
        assert_eq!(e["ticket_id"].as_str(), Some(self.ticket.as_str()), "the ticket changed: {e}");
        self.positions.push(e["position"].as_u64().unwrap());
    }

    /// Reads until it is served, then starts its session; checks positions never rose.
    async fn served(mut self) -> Client {
        loop {
            let e = self.client.event().await;
            match e["type"].as_str() {
                Some("session.queue_update") => self.update(&e),
                Some("session.queue_done") => break,
                _ => panic!("while waiting: {e}"),
            }
        }
        assert!(self.positions.windows(2).all(|w| w[1] <= w[0]), "a position rose: {:?}", self.positions);
        self.client.send(json!({"type": "session.init", "payload": {}})).await;
        self.client.expect("session.created").await;
        self.client
    }
}

/// Speaks one chunk and hears the listen answer: the session works.
async fn talk(c: &mut Client, input: &str) {
    c.send(append(&loud())).await;
    assert_eq!(kinds(&answer_to(c, input).await), ["listen"]);
}

async fn close(mut c: Client) {
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
}

/// A worker's session as its node logged it: from its attach to the end of its link.
#[derive(Debug, Clone)]
struct Held {
    worker: String,
    ticket: u64,
}

/// Every session each node's worker held, in the order of its log (attach lines name the
/// ticket; the next "link N ended" of that worker ends it).
fn sessions_of(node_log: &str) -> Vec<Held> {
    let mut held: Vec<Held> = Vec::new();
    let mut open: HashMap<String, usize> = HashMap::new(); // worker -> its session in `held`
    for line in node_log.lines() {
        if let Some(rest) = line.split("worker ").nth(1) {
            let worker = rest.split(':').next().unwrap_or("").to_string();
            if line.contains(": attached to gateway") {
                let ticket = line.rsplit("for ticket ").next().and_then(|t| t.trim().parse().ok()).unwrap_or(0);
                assert!(!open.contains_key(&worker), "worker {worker} attached twice at once:\n{node_log}");
                open.insert(worker.clone(), held.len());
                held.push(Held { worker, ticket });
            } else if line.contains("ended (") && line.contains(": link ") {
                open.remove(&worker);
            }
        }
    }
    held
}

/// The invariants: no worker held by two sessions at once (checked while parsing), every
/// session attached with a ticket, and no ticket given two workers.
fn check_invariants(logs: &[String]) -> Vec<Held> {
    let all: Vec<Held> = logs.iter().flat_map(|l| sessions_of(l)).collect();
    let mut tickets: HashMap<u64, &Held> = HashMap::new();
    for h in &all {
        assert!(h.ticket != 0, "an attach without a ticket: {h:?}");
        if let Some(other) = tickets.insert(h.ticket, h) {
            panic!("ticket {} was given two workers: {other:?} and {h:?}", h.ticket);
        }
    }
    all
}

#[tokio::test]
async fn three_replicas_share_one_fifo_and_the_nodes_workers() {
    if !needs(&[Need::Redis]) {
        return;
    }
    let redis = Redis::start();
    let n1 = node(&redis, "n1", 1);
    let n2 = node(&redis, "n2", 1);
    let g = [replica(&redis, "g1"), replica(&redis, "g2"), replica(&redis, "g3")];

    // Two workers in the cluster: the first two clients (of two replicas) are served.
    let mut a = active(&g[0], "audio").await;
    let mut b = active(&g[1], "audio").await;
    talk(&mut a, "input_1").await;
    talk(&mut b, "input_1").await;
    // The next clients wait, in one order across the replicas.
    let c = Waiter::join(&g[2]).await;
    let mut d = Waiter::join(&g[0]).await;
    let e = Waiter::join(&g[1]).await;
    assert_eq!((c.positions[0], d.positions[0], e.positions[0]), (1, 2, 3));
    // Tickets are numbered in the order of arrival, across replicas; they are served in that
    // order below (each is served while the next still waits).
    let number = |w: &Waiter| w.ticket.trim_start_matches("ticket_").parse::<u64>().unwrap();
    assert!(number(&c) < number(&d) && number(&d) < number(&e), "{} {} {}", c.ticket, d.ticket, e.ticket);
    // Any replica's status shows the whole queue and every node's workers (as last read).
    g[1].wait_status("the whole cluster", WAIT, |s| {
        let workers = s["workers"].as_array().unwrap();
        s["queue"]["length"] == 3 && workers.len() == 2 && workers.iter().all(|w| w["state"] == "busy")
    });

    // A worker freed on replica g1 goes to the head of the queue (on g3), and everyone moves up.
    close(a).await;
    let mut c = c.served().await;
    talk(&mut c, "input_1").await;
    d.until_position(1).await;
    close(b).await;
    let mut d = d.served().await;
    talk(&mut d, "input_1").await;
    close(c).await;
    let e = e.served().await;
    close(d).await;
    close(e).await;

    let on_n1 = check_invariants(&[n1.logs()]);
    let on_n2 = check_invariants(&[n2.logs()]);
    assert_eq!(on_n1.len() + on_n2.len(), 5, "five sessions: {on_n1:?} {on_n2:?}");
    assert!(!on_n1.is_empty() && !on_n2.is_empty(), "both nodes served");
    assert!(on_n1.iter().chain(&on_n2).all(|h| h.worker == "sim-0"));
    check_invariants(&[n1.logs(), n2.logs()]);
    for s in &g {
        s.wait_idle();
    }
}

#[tokio::test]
async fn a_killed_replica_frees_its_worker_and_its_waiting_tickets_leave() {
    if !needs(&[Need::Redis]) {
        return;
    }
    let redis = Redis::start();
    let n1 = node(&redis, "n1", 1);
    let mut g1 = replica(&redis, "g1");
    let g2 = replica(&redis, "g2");
    let mut held = active(&g1, "audio").await;
    talk(&mut held, "input_1").await;
    let _doomed = Waiter::join(&g1).await; // position 1, on the replica about to die
    let survivor = Waiter::join(&g2).await;
    assert_eq!(survivor.positions[0], 2);

    g1.signal("KILL");
    g1.skip_invariants();
    let killed = Instant::now();
    // The node frees the worker at once (the link died); the dead replica's ticket leaves
    // within its lease; the survivor moves up and is served.
    let mut served = survivor.served().await;
    assert!(killed.elapsed() < Duration::from_secs(5), "served {:?} after the kill", killed.elapsed());
    talk(&mut served, "input_1").await;
    close(served).await;
    check_invariants(&[n1.logs()]);
    drop(held);
    g2.wait_idle();
}

#[tokio::test]
async fn a_replica_paused_past_its_lease_rejoins_and_nothing_is_assigned_twice() {
    if !needs(&[Need::Redis]) {
        return;
    }
    let (redis, n1, g1, g2) = two_replicas();
    let mut first = active(&g2, "audio").await;
    talk(&mut first, "input_1").await;
    let mut paused = Waiter::join(&g1).await; // position 1
    let second = Waiter::join(&g2).await; // position 2
    assert_eq!((paused.positions[0], second.positions[0]), (1, 2));

    g1.signal("STOP");
    forgotten(&redis, "g1").await; // past its 1 s lease
    // Meanwhile the worker is freed: the paused replica's ticket is gone, so g2's client
    // is served.
    close(first).await;
    let mut second = second.served().await;
    talk(&mut second, "input_1").await;
    g1.signal("CONT");
    // The resumed replica finds the store forgot it and enqueues its client again with its
    // ticket: first in line again (its position never rose), then served.
    g1.wait_log("enqueued again", WAIT);
    paused.until_position(1).await;
    close(second).await;
    let mut third = paused.served().await;
    talk(&mut third, "input_1").await;
    close(third).await;
    check_invariants(&[n1.logs()]);
    g1.wait_idle();
    g2.wait_idle();
}

#[tokio::test]
async fn a_killed_node_ends_its_sessions_and_waiting_clients_keep_waiting() {
    if !needs(&[Need::Redis]) {
        return;
    }
    let (redis, n1, g1, g2) = two_replicas();
    let mut on_n1 = active(&g1, "audio").await;
    talk(&mut on_n1, "input_1").await;
    let waiting = Waiter::join(&g2).await;
    n1.kill();
    // The session on the dead node ends with backend_error; the waiting client waits on.
    let closed = on_n1.until("session.closed").await;
    assert_eq!(closed["reason"], "backend_error", "{closed}");
    let n2 = node(&redis, "n2", 1);
    let mut served = waiting.served().await;
    talk(&mut served, "input_1").await;
    close(served).await;
    check_invariants(&[n2.logs()]);
    g2.wait_idle();
}

#[tokio::test]
async fn a_redis_restart_keeps_sessions_running_and_the_waiting_order() {
    if !needs(&[Need::Redis]) {
        return;
    }
    let (redis, n1, g1, g2) = two_replicas();
    let mut running = active(&g1, "audio").await;
    talk(&mut running, "input_1").await;
    let early = Waiter::join(&g2).await;
    let late = Waiter::join(&g1).await;
    assert_eq!((early.positions[0], late.positions[0]), (1, 2));

    let redis = redis.restart(); // everything in it is lost
    // Audio never passes through Redis: the session goes on.
    talk(&mut running, "input_2").await;
    // Replicas and node register again; the waiting clients are enqueued again, in order.
    g1.wait_log("enqueued again", WAIT);
    g2.wait_log("enqueued again", WAIT);
    let deadline = Instant::now() + WAIT;
    while redis.command("ZCARD {og}:q").as_deref() != Some(":2\r\n") {
        assert!(Instant::now() < deadline, "the two waiting clients are back in the queue");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    close(running).await;
    let mut early = early.served().await;
    talk(&mut early, "input_1").await;
    close(early).await;
    let late = late.served().await;
    close(late).await;
    check_invariants(&[n1.logs()]);
    g1.wait_idle();
    g2.wait_idle();
}

#[tokio::test]
async fn without_redis_new_clients_are_refused_and_running_sessions_go_on() {
    if !needs(&[Need::Redis]) {
        return;
    }
    let redis = Redis::start();
    let _n1 = node(&redis, "n1", 2);
    let g1 = replica(&redis, "g1");
    let mut running = active(&g1, "audio").await;
    redis.signal("STOP");
    // The replica's beat fails: it knows the store is down.
    g1.wait_status("the store unreachable", WAIT, |s| s["cluster"]["store"] == "unreachable");
    talk(&mut running, "input_1").await;
    let mut refused = Client::connect(&g1.url("/v1/realtime?mode=audio")).await;
    let e: Value = refused.until("error").await;
    assert_eq!(e["error"]["code"], "service_unavailable", "{e}");
    redis.signal("CONT");
    close(running).await;
    // Once Redis answers again, clients are served.
    let (c, _) = served_when_back(&g1, Instant::now() + WAIT, "after Redis came back").await;
    close(c).await;
    g1.wait_idle();
}

#[tokio::test]
async fn a_replica_cut_off_from_redis_while_others_keep_it() {
    if !needs(&[Need::Redis]) {
        return;
    }
    let redis = Redis::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", redis.port).parse().unwrap());
    let n1 = node(&redis, "n1", 1);
    let g1 = replica_at(&format!("redis://{}/0", proxy.addr), "g1"); // reaches Redis through the proxy
    let g2 = replica(&redis, "g2");
    let mut first = active(&g2, "audio").await;
    talk(&mut first, "input_1").await;
    let cut_off = Waiter::join(&g1).await; // position 1
    let mut other = Waiter::join(&g2).await; // position 2
    assert_eq!((cut_off.positions[0], other.positions[0]), (1, 2));

    proxy.cut();
    // g1 cannot beat: new clients of g1 are refused; after its lease its ticket leaves the
    // queue, and g2's client moves up.
    g1.wait_log("cannot reach the store", WAIT);
    let mut refused = Client::connect(&g1.url("/v1/realtime?mode=audio")).await;
    assert_eq!(refused.until("error").await["error"]["code"], "service_unavailable");
    other.until_position(1).await;
    // The worker goes to g2's client meanwhile; the session on it works.
    close(first).await;
    let mut second = other.served().await;
    talk(&mut second, "input_1").await;

    proxy.restore();
    // g1 is back: its client is enqueued again with its ticket, first in line, then served.
    g1.wait_log("enqueued again", WAIT);
    close(second).await;
    let mut third = cut_off.served().await;
    talk(&mut third, "input_1").await;
    close(third).await;
    check_invariants(&[n1.logs()]);
    g1.wait_idle();
    g2.wait_idle();
}

#[tokio::test]
async fn through_sentinels_a_failover_of_the_store_costs_a_pause_and_nothing_else() {
    if !needs(&[Need::Redis]) {
        return;
    }
    let master = Redis::start();
    let standby = Redis::replica_of(&master);
    let sentinel = Sentinel::start("og-store", &master, "sekret");
    // The URL's host is not used: the Sentinels name the master. They want their password.
    let section = |name: &str, replica: bool| {
        format!(
            "{}sentinels = [\"redis://:sekret@{}\"]\nsentinel_master = \"og-store\"\n",
            cluster_at("redis://127.0.0.1:1/0", name, replica),
            sentinel.address()
        )
    };
    let n1 = Node::start(&format!("{}\n{}", workers(1, ""), section("n1", false)), "");
    registered(&master, &n1, "n1", 1);
    let g1 = Server::start(
        Setup::default().workers(String::new()).queue("update_interval_s = 1.0").extra(&section("g1", true)),
    );
    let mut running = active(&g1, "audio").await;
    talk(&mut running, "input_1").await;

    drop(master); // killed: the Sentinel promotes the replica
    let deadline = Instant::now() + Duration::from_secs(30);
    while !standby.command("ROLE").is_some_and(|r| r.contains("master")) {
        assert!(Instant::now() < deadline, "the Sentinel never promoted the replica");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Audio never passes through Redis: the session goes on, and ends.
    talk(&mut running, "input_2").await;
    close(running).await;
    // Replica and node find the new master: a new client is served by the worker.
    let (mut c, refused) = served_when_back(&g1, deadline, "after the failover").await;
    for first in refused {
        assert_eq!(first["error"]["code"], "service_unavailable", "{first}");
    }
    talk(&mut c, "input_1").await;
    close(c).await;
    for log in [g1.logs(), n1.logs()] {
        assert!(log.contains("asking the Sentinels again"), "{log}");
    }
    assert_eq!(standby.command("SISMEMBER {og}:cap:audio n1/sim-0").as_deref(), Some(":1\r\n"));
    check_invariants(&[n1.logs()]);
    g1.wait_idle();
}

/// A client of `server` once the store is back: connects again every 200 ms until one is
/// served (its session created), by `deadline`. Answers it and what the others heard first.
async fn served_when_back(server: &Server, deadline: Instant, when: &str) -> (Client, Vec<Value>) {
    let mut refused = Vec::new();
    loop {
        let mut c = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
        let first = c.event().await;
        if first["type"] == "session.queue_done" || first["type"] == "session.queued" {
            if first["type"] == "session.queued" {
                c.until("session.queue_done").await;
            }
            c.send(json!({"type": "session.init", "payload": {}})).await;
            c.expect("session.created").await;
            return (c, refused);
        }
        assert!(Instant::now() < deadline, "never served {when}: {first}");
        refused.push(first);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One session on `server`: served, heard, closed.
async fn one_session(server: &Server) {
    let mut c = active(server, "audio").await;
    talk(&mut c, "input_1").await;
    close(c).await;
}

/// Hand-overs on `server`: `count` times a client waits while `holder` holds the worker, and
/// is served when `holder` closes; answers the last one served.
async fn hand_overs(server: &Server, mut holder: Client, count: usize) -> Client {
    for _ in 0..count {
        let waiter = Waiter::join(server).await;
        close(holder).await;
        holder = waiter.served().await;
        talk(&mut holder, "input_1").await;
    }
    holder
}

#[tokio::test]
async fn hand_overs_are_pushed_on_links_kept_open_to_their_node() {
    if !needs(&[Need::Redis]) {
        return;
    }
    let redis = Redis::start();
    let n1 = node(&redis, "n1", 1);
    let g1 = replica(&redis, "g1");
    let address = n1.addr.to_string();
    let ready = format!("omni_node_standby_links{{address=\"{address}\"}}");
    let attached =
        |link: &str, node: &str| g1.metric(&format!("omni_node_attaches_total{{link=\"{link}\",node=\"{node}\"}}"));

    // A client granted an idle worker attaches on a link of its own; from the first grant from
    // a node on, the replica keeps cluster.standby_links (4) links open to it.
    one_session(&g1).await;
    assert_eq!(attached("opened", "n1"), 1.0);
    g1.wait_metric(&ready, 4.0, WAIT);
    // The node has taken its worker back (else the next client would wait for it, and be
    // handed it on a link as below, not granted it idle).
    g1.wait_status("n1's worker idle again", WAIT, |s| s["workers"][0]["state"] == "idle");
    // A worker freed while a client of g1 waits: the node attaches it to one of those links and
    // says so there (no attach from the replica); another link is opened behind it.
    let holder = active(&g1, "audio").await;
    let holder = hand_overs(&g1, holder, 2).await;
    g1.wait_metric(&ready, 4.0, WAIT);
    close(holder).await;
    assert_eq!((attached("opened", "n1"), attached("pushed", "n1")), (2.0, 2.0));
    assert_eq!(n1.logs().matches("pushed on its link").count(), 2, "{}", n1.logs());
    // Each session's link was closed by the replica on purpose: no failure counted or logged.
    assert_eq!(g1.metric("omni_node_link_failures_total{node=\"n1\",reason=\"closed\"}"), 0.0);
    assert!(!g1.logs().contains("the node closed the link"), "{}", g1.logs());

    // The node restarts on the same address: the links to the old process end, and links are
    // opened to the new one, which pushes its grants on them.
    let dir = n1.kill();
    let config = format!("{}\n{}", workers(1, ""), cluster(&redis, "n2", false));
    let n2 = Node::start_in(dir, &config, &format!("bind = \"{address}\""));
    registered(&redis, &n2, "n2", 1);
    let holder = active(&g1, "audio").await;
    g1.wait_metric(&ready, 4.0, WAIT);
    close(hand_overs(&g1, holder, 1).await).await;
    assert_eq!(attached("pushed", "n2"), 1.0, "{}", n2.logs());
    check_invariants(&[n2.logs()]);
    g1.wait_idle();
}

/// A link to `node` through the handshake as `secret`, asking for a link kept open for the
/// grants of replica `gateway`: what the node answers first (None: it closed).
async fn standby_as(
    node: &Node,
    secret: omni_backend_host::link::handshake::Secret<'_>,
    gateway: &str,
) -> (tokio::net::TcpStream, Option<omni_backend_host::link::wire::FromNode>) {
    use omni_backend_host::link::wire::{MAX_UNPROVEN_FRAME, Request, read_frame};
    let mut stream = tokio::net::TcpStream::connect(node.addr).await.unwrap();
    let request = Request::Standby { gateway: gateway.into() };
    omni_backend_host::link::handshake::open(&mut stream, secret, request).await.unwrap();
    let first = read_frame(&mut stream, MAX_UNPROVEN_FRAME).await.unwrap();
    (stream, first)
}

/// Reads a link until it ends (pings skipped): whether it did within `WAIT`.
async fn ends(link: &mut tokio::net::TcpStream) -> bool {
    use omni_backend_host::link::wire::{FromNode, MAX_UNPROVEN_FRAME, read_frame};
    let read = async {
        loop {
            match read_frame::<FromNode>(link, MAX_UNPROVEN_FRAME).await {
                Ok(Some(FromNode::Ping)) => continue,
                _ => return,
            }
        }
    };
    tokio::time::timeout(WAIT, read).await.is_ok()
}

#[tokio::test]
async fn each_replica_proves_its_own_name_and_one_is_revoked_without_touching_the_others() {
    use omni_backend_host::link::handshake::Secret;
    use omni_backend_host::link::replica::{Credential, issue};
    use omni_backend_host::link::wire::{FromNode, MAX_UNPROVEN_FRAME, ToNode, read_frame, write_frame};
    if !needs(&[Need::Redis]) {
        return;
    }
    let redis = Redis::start();
    let n1 = node(&redis, "n1", 1);
    let (r1, r2) =
        (Credential::parse(&issue(NODE_TOKEN, "r1")).unwrap(), Credential::parse(&issue(NODE_TOKEN, "r2")).unwrap());
    let as_r1 = Secret::Replica { name: "r1", password: r1.password() };
    let as_r2 = Secret::Replica { name: "r2", password: r2.password() };
    // Each replica keeps links open for its own grants...
    let (mut r1_link, first) = standby_as(&n1, as_r1, "r1").await;
    assert!(matches!(first, Some(FromNode::Ready)), "{first:?}");
    let (mut r2_link, first) = standby_as(&n1, as_r2, "r2").await;
    assert!(matches!(first, Some(FromNode::Ready)), "{first:?}");
    // ...and no other's: not with its own credential, nor with the node's token.
    for (secret, proved) in [(as_r1, "r1"), (Secret::Token(NODE_TOKEN), "a holder of the node's token")] {
        let (_, first) = standby_as(&n1, secret, "r2").await;
        match first {
            Some(FromNode::Refused(why)) => assert!(why.contains("that replica's own credential"), "{why}"),
            other => panic!("a link for r2's grants, proved as {proved}: {other:?}"),
        }
        n1.wait_log(&format!("grants of replica r2 refused: it proved {proved}"), WAIT);
    }
    // r1 is revoked on the node (its config, then SIGHUP): its link ends, it is refused from
    // then on, and r2 goes on as before.
    let path = n1.dir().join("node.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, config.replacen("[cluster]\n", "[cluster]\nrevoked_replicas = [\"r1\"]\n", 1)).unwrap();
    n1.signal("HUP");
    n1.wait_log("revoked replicas now [r1] (1 newly revoked)", WAIT);
    assert!(ends(&mut r1_link).await, "r1's link kept open for grants did not end");
    n1.wait_log("replica r1 is revoked: its 1 link(s) kept open for grants end", WAIT);
    let (_, first) = standby_as(&n1, as_r1, "r1").await;
    match first {
        Some(FromNode::Refused(why)) => assert_eq!(why, "replica r1 is revoked on this node"),
        other => panic!("a revoked replica's link: {other:?}"),
    }
    write_frame(&mut r2_link, &ToNode::Ping).await.unwrap();
    let answer = read_frame::<FromNode>(&mut r2_link, MAX_UNPROVEN_FRAME).await.unwrap();
    assert!(matches!(answer, Some(FromNode::Ping)), "r2's link, after r1 was revoked: {answer:?}");
    let (_, first) = standby_as(&n1, as_r2, "r2").await;
    assert!(matches!(first, Some(FromNode::Ready)), "r2 after r1 was revoked: {first:?}");
}

#[tokio::test]
async fn a_grant_its_node_did_not_sign_is_never_dialled() {
    if !needs(&[Need::Redis]) {
        return;
    }
    let redis = Redis::start();
    let n1 = node(&redis, "n1", 1);
    let g1 = replica(&redis, "g1");
    let held = active(&g1, "audio").await;
    let waiter = Waiter::join(&g1).await;
    // Whoever can write to the store puts a grant for the waiting ticket on the replica's list,
    // naming a listener of its own (where the token, then the client's audio, went before).
    let fake = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    fake.set_nonblocking(true).unwrap();
    let ticket = waiter.ticket.trim_start_matches("ticket_").to_string();
    // Its worker's name is 30 KB long: it costs the log no more than a short one would (its
    // fields are clipped when read, the refusal is said once in a while, the worker told without
    // them).
    let forged = format!(
        "{ticket} n1/sim-0{} {} 0123abcd audio {}",
        "w".repeat(30_000),
        fake.local_addr().unwrap(),
        "ab".repeat(32)
    );
    let before = g1.logs().len();
    assert_eq!(redis.command(&format!("RPUSH {{og}}:g:g1 \"{forged}\"")).as_deref(), Some(":1\r\n"));
    g1.wait_log("is not signed by its node", WAIT);
    g1.wait_log("not taken", WAIT); // the lend failed: a dial would have come before
    assert_eq!(g1.metric("omni_grants_refused_total"), 1.0);
    let grown = g1.logs().len() - before;
    assert!(grown < 8192, "the log grew {grown} bytes for a grant with a 30 KB field");
    let dialled = |fake: &std::net::TcpListener| fake.accept().map(|(_, peer)| peer.to_string());
    assert_eq!(
        dialled(&fake).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "the forged address was dialled"
    );
    // The ticket waits on in its place, and the real node's grant serves it.
    close(held).await;
    let mut served = waiter.served().await;
    talk(&mut served, "input_1").await;
    close(served).await;
    assert_eq!(
        dialled(&fake).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "the forged address was dialled"
    );
    // The node may push the waiting ticket a grant while the forged one is being refused: that
    // one is not taken, and the node grants the same worker to the ticket again 3 s later. So the
    // ticket may be attached to its worker twice, one after the other (`sessions_of` fails on
    // two at once), but never to two workers.
    let held = sessions_of(&n1.logs());
    let mut workers: HashMap<u64, &str> = HashMap::new();
    for h in &held {
        assert!(h.ticket != 0, "an attach without a ticket: {h:?}");
        let first = *workers.entry(h.ticket).or_insert(&h.worker);
        assert_eq!(first, h.worker, "ticket {} was given two workers", h.ticket);
    }
    g1.wait_idle();
}

#[tokio::test]
async fn a_replica_dials_no_node_outside_its_node_networks() {
    if !needs(&[Need::Redis]) {
        return;
    }
    let redis = Redis::start();
    let n1 = node(&redis, "n1", 1);
    let section = format!("{}node_networks = [\"10.0.0.0/8\"]\n", cluster(&redis, "g1", true));
    let mut g1 = Server::start(Setup::default().workers(String::new()).extra(&section));
    // The node's signed grant names 127.0.0.1: outside, so neither it nor a link kept open to
    // it is dialled; the client is not refused.
    let client = Client::connect(&g1.url("/v1/realtime?mode=audio")).await;
    g1.wait_log("is outside [cluster] node_networks: not dialled", WAIT);
    g1.wait_metric("omni_node_link_failures_total{node=\"n1\",reason=\"outside_networks\"}", 1.0, WAIT);
    assert!(!n1.logs().contains("attached to gateway"), "{}", n1.logs());
    drop(client);
    g1.skip_invariants();
}

#[tokio::test]
async fn a_store_behind_tls_is_verified_against_redis_ca() {
    if !needs(&[Need::Redis]) {
        return;
    }
    // A private CA's certificate (self-signed) on the store's TLS port.
    let dir = tempfile::tempdir().unwrap();
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let (cert, key) = (dir.path().join("redis.pem"), dir.path().join("redis.key"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    let (redis, tls_port) = Redis::start_tls(&cert, &key);
    let url = format!("rediss://127.0.0.1:{tls_port}/0");
    let n1 = node(&redis, "n1", 1);
    // Checked against the public CAs only, the store is not trusted: the replica cannot beat.
    let mut untrusted = replica_at(&url, "g0");
    untrusted.wait_log("invalid peer certificate: UnknownIssuer", WAIT);
    untrusted.skip_invariants();
    drop(untrusted);
    // With redis_ca, it is.
    let section = format!("{}redis_ca = \"{}\"\n", cluster_at(&url, "g1", true), cert.display());
    let g1 = Server::start(Setup::default().workers(String::new()).queue("update_interval_s = 1.0").extra(&section));
    one_session(&g1).await;
    check_invariants(&[n1.logs()]);
    g1.wait_idle();
    drop(g1);
    // Behind Sentinels on TLS too: both the Sentinel and the master it names are verified
    // against redis_ca.
    let (sentinel, sentinel_tls) = Sentinel::start_tls("og-store", tls_port, "sekret", &cert, &key);
    let through = format!(
        "{}redis_ca = \"{}\"\nsentinels = [\"rediss://:sekret@127.0.0.1:{sentinel_tls}\"]\nsentinel_master = \"og-store\"\n",
        cluster_at(&url, "g2", true),
        cert.display()
    );
    let g2 = Server::start(Setup::default().workers(String::new()).queue("update_interval_s = 1.0").extra(&through));
    one_session(&g2).await;
    check_invariants(&[n1.logs()]);
    g2.wait_idle();
    // Without it, the Sentinel's certificate is not trusted: nothing is reached.
    let untrusted = format!(
        "{}sentinels = [\"rediss://:sekret@127.0.0.1:{sentinel_tls}\"]\nsentinel_master = \"og-store\"\n",
        cluster_at(&url, "g3", true)
    );
    let mut g3 = Server::start(Setup::default().workers(String::new()).extra(&untrusted));
    g3.wait_log("UnknownIssuer", WAIT);
    g3.skip_invariants();
    drop(sentinel);
}

/// A small seeded generator (xorshift): a nemesis run is repeated exactly by its seed.
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from))
    }
}

/// A client of the nemesis run: joins through `url`, waits (its positions must never rise),
/// is served, holds its worker for `hold`, closes. A refusal while the store is unreachable
/// (`service_unavailable`) is retried; a session its node's death ends still counts as served.
/// Returns how many times it was refused before it was served.
async fn nemesis_client(url: String, hold: Duration, label: String) -> u32 {
    let mut refusals = 0;
    loop {
        let mut c = Client::connect(&url).await;
        let mut positions: Vec<u64> = Vec::new();
        let served = loop {
            match c.next().await {
                Seen::Event(e) => match e["type"].as_str() {
                    Some("session.queued") | Some("session.queue_update") => {
                        positions.push(e["position"].as_u64().unwrap());
                    }
                    Some("session.queue_done") => break true,
                    Some("error") if e["error"]["code"] == "service_unavailable" => break false,
                    _ => panic!("{label}: while waiting: {e}"),
                },
                Seen::Closed(code) if !positions.is_empty() || refusals > 0 => {
                    panic!("{label}: closed ({code:?}) while waiting; positions {positions:?}")
                }
                Seen::Closed(_) => break false,
            }
        };
        assert!(positions.windows(2).all(|w| w[1] <= w[0]), "{label}: a position rose: {positions:?}");
        if !served {
            refusals += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        c.send(json!({"type": "session.init", "payload": {}})).await;
        let created = c.event().await;
        if created["type"] == "session.created" {
            tokio::time::sleep(hold).await;
            c.send(json!({"type": "session.close"})).await;
        }
        // Closed by the client, or by the node's death (backend_error).
        let closed = if created["type"] == "session.closed" { created } else { c.until("session.closed").await };
        let reason = closed["reason"].as_str().unwrap_or("").to_string();
        assert!(["user_stop", "backend_error"].contains(&reason.as_str()), "{label}: {closed}");
        return refusals;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_nemesis_never_assigns_twice_and_everyone_is_served() {
    if !needs(&[Need::Redis]) {
        return;
    }
    // OMNI_NEMESIS_SEED runs that seed alone (each run prints its seed; a failure names it).
    // Seed 22 found orphan tickets (an enqueue that timed out after Redis had run it) taking
    // every worker offered to them.
    let seeds = match std::env::var("OMNI_NEMESIS_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => vec![seed],
        None => vec![0x5eed_2026, 22, 7],
    };
    for seed in seeds {
        nemesis(seed).await;
    }
}

/// One nemesis run: three replicas, two nodes, 18 clients, about 6 s of faults from `seed`.
async fn nemesis(seed: u64) {
    println!("nemesis seed {seed}");
    let mut dice = Dice((seed ^ 0x9e37_79b9_7f4a_7c15) | 1);
    let redis = Redis::start();
    let mut nodes: Vec<Option<Node>> = vec![Some(node(&redis, "n1", 1)), Some(node(&redis, "n2", 1))];
    let mut replicas: Vec<Server> = (1..=3).map(|i| replica(&redis, &format!("g{i}"))).collect();
    let mut logs: Vec<String> = Vec::new();

    // 18 clients over the three replicas, arriving over about 3 s, each holding its worker for
    // up to 300 ms: two workers, so most of them wait while the faults come.
    let mut clients = Vec::new();
    for i in 0..18 {
        let url = replicas[i % 3].url("/v1/realtime?mode=audio");
        let (start, hold) = (dice.millis(0, 3000), dice.millis(20, 300));
        clients.push(tokio::spawn(async move {
            tokio::time::sleep(start).await;
            nemesis_client(url, hold, format!("client {i}")).await
        }));
    }
    // Faults one at a time for about 6 s: a replica paused (sometimes past its 1 s lease),
    // Redis paused, a node killed and started again on its address.
    let until = Instant::now() + Duration::from_secs(6);
    let mut faults = Vec::new();
    while Instant::now() < until {
        tokio::time::sleep(dice.millis(100, 600)).await;
        match dice.below(3) {
            0 => {
                let (k, pause) = (dice.below(3) as usize, dice.millis(200, 1600));
                faults.push(format!("replica g{} paused {pause:?}", k + 1));
                replicas[k].signal("STOP");
                tokio::time::sleep(pause).await;
                replicas[k].signal("CONT");
            }
            1 => {
                let pause = dice.millis(100, 900);
                faults.push(format!("redis paused {pause:?}"));
                redis.signal("STOP");
                tokio::time::sleep(pause).await;
                redis.signal("CONT");
            }
            _ => {
                let j = dice.below(2) as usize;
                faults.push(format!("node n{} killed and restarted", j + 1));
                let old = nodes[j].take().unwrap();
                let (address, log) = (old.addr, old.logs());
                logs.push(log);
                let dir = old.kill();
                let config = format!("{}\n{}", workers(1, ""), cluster(&redis, &format!("n{}", j + 1), false));
                nodes[j] = Some(Node::start_in(dir, &config, &format!("bind = \"{address}\"")));
            }
        }
    }
    println!("faults: {faults:#?}");
    // Everyone is served in the end (each client's positions never rose: checked as it went).
    let mut refused = 0;
    for (i, client) in clients.into_iter().enumerate() {
        refused += tokio::time::timeout(Duration::from_secs(60), client)
            .await
            .unwrap_or_else(|_| panic!("seed {seed}: client {i} never served; faults {faults:?}"))
            .unwrap_or_else(|e| panic!("seed {seed}: client {i}: {e}; faults {faults:?}"));
    }
    // No worker held two sessions at once, no ticket had two workers: every node's log, every
    // incarnation.
    logs.extend(nodes.iter().flatten().map(|n| n.logs()));
    let held = check_invariants(&logs);
    assert!(held.len() >= 18, "seed {seed}: {} sessions in the nodes' logs for 18 clients", held.len());
    println!("{} sessions on the nodes; {refused} refusals (service_unavailable), retried", held.len());
    for r in &mut replicas {
        r.wait_idle();
    }
}

/// A node's worker that dies mid-session is a worker of the replica's pool like any other: the
/// replica's webhooks say `worker.failed` (with the node's reason), its status shows it, and
/// `worker.recovered` follows when the node has it open again and the next client takes it.
#[tokio::test]
async fn a_nodes_worker_dying_mid_session_is_told_by_the_replicas_webhooks() {
    if !needs(&[Need::Redis]) {
        return;
    }
    const SECRET: &str = "webhook-secret-0123456789";
    let redis = Redis::start();
    let node =
        Node::start(&format!("{}\n{}", process_workers(1, "segv_at_step = 2"), cluster(&redis, "n1", false)), "");
    registered(&redis, &node, "n1", 1);
    let receiver = Receiver::start();
    let hooks = format!(
        "[[webhooks]]\nname = \"ops\"\nurl = \"{}\"\nevents = [\"worker.failed\", \"worker.recovered\"]\nsecret = \"{SECRET}\"\nretry_base_s = 0.1\n",
        receiver.url()
    );
    let g1 = Server::start(
        Setup::default()
            .workers(String::new())
            .queue("update_interval_s = 1.0")
            .extra(&format!("{}\n{hooks}", cluster(&redis, "g1", true))),
    );
    let mut c = active(&g1, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&loud())).await;
    assert_eq!(c.until("session.closed").await["reason"], "backend_error");
    let event = |name: &'static str| move |r: &Received| r.header("X-Omni-Event") == Some(name);
    let failed = receiver.wait_for("worker.failed", event("worker.failed")).json();
    assert_eq!(failed["data"]["worker"], "n1/sim-0", "{failed}");
    assert_eq!(failed["data"]["node"], "n1", "{failed}");
    assert!(failed["data"]["reason"].as_str().unwrap_or("").contains("SIGSEGV"), "{failed}");
    g1.wait_status("the failure in the replica's status", WAIT, |s| {
        s["workers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["name"] == "n1/sim-0" && w["last_error"].as_str().unwrap_or("").contains("SIGSEGV"))
    });
    // The node opens it again and offers it; the next client takes it: it has recovered.
    let mut again = active(&g1, "audio").await;
    again.send(append(&loud())).await;
    answer_to(&mut again, "input_1").await;
    let recovered = receiver.wait_for("worker.recovered", event("worker.recovered")).json();
    assert_eq!(
        (recovered["data"]["worker"].as_str(), recovered["data"]["to"].as_str()),
        (Some("n1/sim-0"), Some("idle"))
    );
    close(again).await;
}

/// The fields of `/status`'s worker rows and the words of their states.
fn row_keys(status: &Value) -> Vec<String> {
    let mut keys: Vec<String> = status["workers"][0].as_object().expect("a worker row").keys().cloned().collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn a_gateway_and_a_replica_show_their_workers_with_the_same_fields_and_words() {
    let redis = Redis::start();
    let _n1 = node(&redis, "n1", 1);
    let g1 = replica(&redis, "g1");
    let gateway = Server::ready(Setup::default());
    let idle = |s: &Value| s["workers"][0]["state"] == "idle";
    let replica_idle = g1.wait_status("the node's worker in the replica's status", WAIT, idle);
    let gateway_idle = gateway.wait_status("the gateway's worker idle", WAIT, idle);
    assert_eq!(row_keys(&replica_idle), row_keys(&gateway_idle), "{replica_idle}\n{gateway_idle}");
    assert_eq!(
        row_keys(&gateway_idle),
        [
            "backend",
            "client_away_s",
            "dialect",
            "failure",
            "last_error",
            "mode",
            "modes",
            "name",
            "node",
            "process_id",
            "restarts",
            "session",
            "sessions_served",
            "state",
            "transport"
        ]
    );
    // A session on each: the same words, and each names its session, dialect and transport.
    let (on_replica, on_gateway) = (active(&g1, "audio").await, active(&gateway, "audio").await);
    for (server, who) in [(&g1, "replica"), (&gateway, "gateway")] {
        let s = server.wait_status(&format!("the {who}'s worker busy"), WAIT, |s| s["workers"][0]["state"] == "busy");
        let w = &s["workers"][0];
        assert!(w["session"].as_str().is_some_and(|id| id.starts_with("sess_")), "{who}: {w}");
        assert_eq!(
            (w["dialect"].as_str(), w["transport"].as_str(), w["mode"].as_str()),
            (Some("minicpm"), Some("websocket"), Some("audio")),
            "{who}: {w}"
        );
        assert_eq!(row_keys(&s).len(), 15, "{who}: {w}");
    }
    close(on_replica).await;
    close(on_gateway).await;
    g1.wait_status("the replica's worker idle again", WAIT, idle);
    gateway.wait_status("the gateway's worker idle again", WAIT, idle);
}

/// The cluster's store and a replica's rules, by the suite the in-memory store passes in the
/// actors' unit tests: one test per scenario, each on a Redis of its own.
mod suite_on_redis {
    use std::sync::Arc;
    use std::time::Duration;

    use omni_actors::edge::coordinator::{Coordinator, NodeStore};
    use omni_actors::queue::suite::{Cluster, Wait};
    use omni_gateway::store::redis::RedisStore;

    use crate::common::*;

    struct OnRedis(Redis);

    impl Cluster for OnRedis {
        fn replica(&self, name: &str, lease: Duration) -> Arc<dyn Coordinator> {
            RedisStore::new(&self.0.url(), "suite", name.into(), lease).unwrap()
        }
        fn node(&self, name: &str, lease: Duration) -> Arc<dyn NodeStore> {
            RedisStore::new(&self.0.url(), "suite", name.into(), lease).unwrap()
        }
        fn pass(&self, by: Duration) -> Wait<'_> {
            // A real store's clock runs while the test waits: this is the time passing.
            Box::pin(tokio::time::sleep(by))
        }
        fn wipe(&self) -> Wait<'_> {
            assert!(self.0.command("FLUSHALL").is_some_and(|a| a.starts_with("+OK")));
            Box::pin(std::future::ready(()))
        }
    }

    omni_actors::cluster_scenarios!(async #[tokio::test] |_name, scenario| {
        if !needs(&[Need::Redis]) {
            return;
        }
        scenario(&OnRedis(Redis::start())).await;
    });
}

/// The YAML documents of a file under `deploy/`.
fn yaml_documents(file: &str) -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy").join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| <Value as serde::Deserialize>::deserialize(doc).unwrap_or_else(|e| panic!("{file}: {e}")))
        .collect()
}

/// Loads an embedded config with the server's own loader (a library path it names is replaced
/// by a file that exists: the keys are checked, not the model).
fn load_embedded(name: &str, toml: &str) -> omni_gateway::config::Config {
    let dir = tempfile::tempdir().unwrap();
    let library = dir.path().join("libmodel.so");
    std::fs::write(&library, b"").unwrap();
    let mut text = String::new();
    for line in toml.lines() {
        if line.trim_start().starts_with("library = ") {
            text.push_str(&format!("library = \"{}\"\n", library.display()));
        } else if line.trim_start().starts_with("credential_file = ") {
            // A replica's credential, mounted by its pod or service: issued here for "replica-x".
            let file = dir.path().join("replica.credential");
            std::fs::write(&file, omni_backend_host::link::replica::issue(NODE_TOKEN, "replica-x")).unwrap();
            text.push_str(&format!("credential_file = \"{}\"\n", file.display()));
        } else {
            text.push_str(line);
            text.push('\n');
        }
    }
    // As shipped, the node token is a placeholder the server refuses; an operator replaces it.
    let path = dir.path().join(name);
    std::fs::write(&path, &text).unwrap();
    if text.contains(PLACEHOLDER_TOKEN) {
        let refused = omni_gateway::config::Config::load(&path).map(drop).expect_err("the placeholder token");
        assert!(refused.to_string().contains("openssl rand"), "{name}: {refused}");
        std::fs::write(&path, text.replace(PLACEHOLDER_TOKEN, NODE_TOKEN)).unwrap();
    }
    omni_gateway::config::Config::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// deploy/compose.yml as written.
fn compose_text() -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/compose.yml")).unwrap()
}

/// The text of the config `name` in the Secrets of `docs`.
fn secrets_text(docs: &[Value], name: &str) -> String {
    docs.iter()
        .filter(|d| d["kind"] == "Secret")
        .find_map(|d| d["stringData"][name].as_str())
        .unwrap_or_else(|| panic!("no Secret holds {name}"))
        .to_string()
}

/// The node token the files under `deploy/` ship with.
const PLACEHOLDER_TOKEN: &str = "change-me-node-token-0123456789";

fn port_of(config: &omni_gateway::config::Config) -> u16 {
    config.bind[0].port()
}

#[test]
fn the_compose_file_and_kubernetes_manifests_parse_and_their_configs_load() {
    // Compose: the replicas' and the node's configs load, as a replica and as a node of one cluster.
    let compose = &yaml_documents("compose.yml")[0];
    let gateway = load_embedded("gateway.toml", compose["configs"]["gateway"]["content"].as_str().unwrap());
    let node = load_embedded("node.toml", compose["configs"]["node"]["content"].as_str().unwrap());
    let (g, n) = (gateway.cluster.as_ref().unwrap(), node.cluster.as_ref().unwrap());
    assert_eq!(g.url, n.url, "one cluster");
    assert_eq!(g.name, "replica-x", "a replica is the name its credential is for");
    assert!(n.revoked_replicas.is_empty());
    assert!(gateway.workers.is_empty() && node.workers.len() == 1);
    let services = &compose["services"];
    // Each replica is handed a credential of its own (a secret, from the environment the
    // operator sets) where the shared config reads it.
    let mut credentials = Vec::new();
    for replica in ["gateway-a", "gateway-b"] {
        let secret = &services[replica]["secrets"][0];
        assert_eq!(secret["target"], "replica.credential", "{replica}");
        let source = secret["source"].as_str().unwrap();
        let from = compose["secrets"][source]["environment"].as_str().unwrap_or_else(|| panic!("{source}"));
        let how = format!("export {from}=$(omni-gateway --config node.toml replica-credential {replica})");
        assert!(compose_text().contains(&how), "the file says how to issue {replica}'s credential into {from}");
        credentials.push(from.to_string());
    }
    assert_ne!(credentials[0], credentials[1], "one credential per replica");
    let command = |s: &str| {
        services[s]["command"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(command("gateway-a")[1..], ["--config", "/etc/omni/gateway.toml"]);
    assert_eq!(command("gateway-b"), command("gateway-a"));
    assert_eq!(command("node")[1..], ["--config", "/etc/omni/node.toml", "node"]);
    assert_eq!(services["gateway-a"]["configs"][0]["target"], "/etc/omni/gateway.toml");
    assert_eq!(services["node"]["configs"][0]["target"], "/etc/omni/node.toml");
    let advertise = services["node"]["environment"]["OMNI_NODE_ADVERTISE"].as_str().unwrap();
    assert_eq!(advertise, format!("node:{}", node.node.as_ref().unwrap().bind[0].port()));
    let balancer = services["balancer"]["networks"]["default"]["ipv4_address"].as_str().unwrap();
    assert!(omni_actors::net::in_any(balancer.parse().unwrap(), &gateway.trusted_proxies), "{balancer}");
    let nginx = compose["configs"]["nginx"]["content"].as_str().unwrap();
    assert!(
        nginx.contains(&format!("server gateway-a:{0}; server gateway-b:{0};", port_of(&gateway)))
            && nginx.contains("proxy_read_timeout 3600s")
    );

    // Kubernetes: every document has a kind; the Secrets' configs load; the pods run them on the
    // ports they bind; the ingress does not cut sessions.
    let mut docs = Vec::new();
    for file in ["k8s/redis.yaml", "k8s/gateway.yaml", "k8s/node.yaml"] {
        docs.extend(yaml_documents(file));
    }
    let kind = |k: &str| docs.iter().filter(|d| d["kind"] == k).collect::<Vec<_>>();
    assert!(
        docs.iter().all(|d| d["apiVersion"].is_string() && d["kind"].is_string() && d["metadata"]["name"].is_string())
    );
    let secrets: HashMap<String, omni_gateway::config::Config> = kind("Secret")
        .iter()
        .flat_map(|s| s["stringData"].as_object().unwrap().iter())
        .filter(|(name, _)| name.ends_with(".toml"))
        .map(|(name, toml)| (name.clone(), load_embedded(name, toml.as_str().unwrap())))
        .collect();
    let (gateway, node) = (&secrets["gateway.toml"], &secrets["node.toml"]);
    let redis_port = kind("Service").iter().find(|s| s["metadata"]["name"] == "omni-redis").unwrap()["spec"]["ports"]
        [0]["port"]
        .as_u64()
        .unwrap();
    assert!(gateway.cluster.as_ref().unwrap().url.ends_with(&format!("@omni-redis:{redis_port}/0")));
    assert_eq!(gateway.cluster.as_ref().unwrap().url, node.cluster.as_ref().unwrap().url);
    // Each pod of the StatefulSet mounts the credential of its own name where the config reads it.
    let gateways = kind("StatefulSet").into_iter().find(|s| s["metadata"]["name"] == "omni-gateway").unwrap();
    let pods = &gateways["spec"];
    let mounts = pods["template"]["spec"]["containers"][0]["volumeMounts"].as_array().unwrap();
    let credential = mounts.iter().find(|m| m["name"] == "replicas").unwrap();
    assert_eq!(credential["subPathExpr"], "$(POD_NAME)");
    let path = credential["mountPath"].as_str().unwrap();
    assert!(secrets_text(&docs, "gateway.toml").contains(&format!("credential_file = \"{path}\"")));
    let issued = kind("Secret").into_iter().find(|s| s["metadata"]["name"] == "omni-gateway-replicas").unwrap();
    for i in 0..pods["replicas"].as_u64().unwrap() {
        let shipped = issued["stringData"][format!("omni-gateway-{i}")].as_str().unwrap();
        assert!(shipped.contains(&format!("replica-credential omni-gateway-{i}")), "{shipped}");
    }
    for (workload, config, file) in [("StatefulSet", gateway, "gateway.toml"), ("DaemonSet", node, "node.toml")] {
        let named = if file == "node.toml" { "omni-node" } else { "omni-gateway" };
        let pod =
            &kind(workload).into_iter().find(|w| w["metadata"]["name"] == named).unwrap()["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        let args: Vec<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        let mount = container["volumeMounts"][0]["mountPath"].as_str().unwrap();
        assert!(args.contains(&format!("{mount}/{file}").as_str()), "{workload} runs {file}: {args:?}");
        let port = if file == "node.toml" { config.node.as_ref().unwrap().bind[0].port() } else { port_of(config) };
        assert_eq!(
            container["ports"][0]["containerPort"].as_u64(),
            Some(port as u64),
            "{workload} exposes its bind port"
        );
        let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap() as f64;
        assert!(grace >= config.server.shutdown_grace_s && grace >= 600.0, "{workload}: sessions may finish");
    }
    let advertise =
        kind("DaemonSet")[0]["spec"]["template"]["spec"]["containers"][0]["env"][1]["value"].as_str().unwrap();
    assert_eq!(advertise, format!("$(POD_IP):{}", node.node.as_ref().unwrap().bind[0].port()));
    let ingress = &kind("Ingress")[0]["metadata"]["annotations"];
    for key in ["proxy-read-timeout", "proxy-send-timeout"] {
        let secs: u64 = ingress[format!("nginx.ingress.kubernetes.io/{key}")].as_str().unwrap().parse().unwrap();
        assert!(secs >= 3600, "{key}: {secs}");
    }
    let policy = |name: &str| {
        let p = kind("NetworkPolicy").into_iter().find(|p| p["metadata"]["name"] == name).unwrap();
        let from = p["spec"]["ingress"][0]["from"].as_array().unwrap();
        let who = |f: &Value| {
            let pods = &f["podSelector"]["matchLabels"]["app"];
            let namespace = &f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"];
            pods.as_str().or(namespace.as_str()).unwrap().to_string()
        };
        from.iter().map(who).collect::<Vec<_>>()
    };
    assert_eq!(policy("omni-gateway"), ["ingress-nginx"], "only the ingress reaches the gateways it is trusted by");
    assert_eq!(policy("omni-node"), ["omni-gateway"], "only the gateways reach a node");
    assert_eq!(policy("omni-redis"), ["omni-gateway", "omni-node"], "only the gateways and nodes reach Redis");
    // Redis runs behind the password its Secret holds, and both roles present it.
    let password =
        kind("Secret").iter().find(|s| s["metadata"]["name"] == "omni-redis").unwrap()["stringData"]["password"]
            .as_str()
            .unwrap()
            .to_string();
    let redis = &kind("StatefulSet")[0]["spec"]["template"]["spec"]["containers"][0];
    assert!(redis["command"][2].as_str().unwrap().contains("--requirepass \"$REDIS_PASSWORD\""), "{redis}");
    assert_eq!(redis["env"][0]["valueFrom"]["secretKeyRef"]["name"], "omni-redis");
    for config in [gateway, node] {
        assert!(config.cluster.as_ref().unwrap().url.starts_with(&format!("redis://:{password}@")));
    }
}

#[test]
fn the_compose_files_redis_needs_the_password_its_replicas_and_node_present() {
    let compose = &yaml_documents("compose.yml")[0];
    let command: Vec<&str> =
        compose["services"]["redis"]["command"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    let at = command.iter().position(|a| *a == "--requirepass").expect("redis runs with a password");
    let password = command[at + 1];
    for name in ["gateway", "node"] {
        let config = load_embedded(&format!("{name}.toml"), compose["configs"][name]["content"].as_str().unwrap());
        assert!(config.cluster.as_ref().unwrap().url.starts_with(&format!("redis://:{password}@")), "{name}");
    }
    assert!(compose["services"]["redis"]["ports"].is_null(), "redis is not published outside the compose network");
}

/// `check-config` on a replica's config, run as an operator would: its exit code and output.
fn check_replica(url: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("replica.toml");
    std::fs::write(&path, format!("[server]\nbind = \"127.0.0.1:0\"\n{}", cluster_at(url, "g1", true))).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_omni-gateway"))
        .arg("check-config")
        .arg(&path)
        .env_remove("OMNI_GATEWAY_CONFIG")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

/// A replica says why its store is down: `check-config` reaches the store and names the
/// (redacted) URL and the reason; a running replica logs it at once and `/status` shows it.
#[tokio::test]
async fn a_replica_says_why_its_store_is_down() {
    if !needs(&[Need::Redis]) {
        return;
    }
    let redis = Redis::start();
    let (code, text) = check_replica(&redis.url());
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("the store at redis://127.0.0.1") && text.contains("answers"), "{text}");
    assert!(text.contains("replica g1: its workers are the cluster's nodes'"), "{text}");
    // Behind a password it was not given, or a wrong one: refused, said so, no password shown.
    assert!(redis.command("CONFIG SET requirepass sekret-0123456789").is_some_and(|a| a.starts_with("+OK")));
    let (code, text) = check_replica(&redis.url());
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("cannot reach the store at redis://127.0.0.1") && text.contains("NOAUTH"), "{text}");
    let wrong = redis.url().replace("redis://", "redis://:not-the-password-42@");
    let (code, text) = check_replica(&wrong);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.to_lowercase().contains("authentication failed") && !text.contains("not-the-password-42"), "{text}");
    // Nothing there.
    let dead = format!("redis://127.0.0.1:{}/0", free_port());
    let (code, text) = check_replica(&dead);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("cannot reach the store") && text.contains("refused"), "{text}");
    // A replica started on it says so at once, and /status shows why.
    let mut g1 = replica_at(&dead, "g1");
    g1.wait_log("replica g1: cannot reach the store", WAIT);
    let status = g1.status();
    assert_eq!(status["cluster"]["store"], "unreachable", "{status}");
    assert!(status["cluster"]["store_error"].as_str().unwrap_or_default().contains("refused"), "{status}");
    g1.skip_invariants();
}

/// A replica's `/status` shows the whole cluster's queue with each ticket's replica and its real
/// wait (counted from the ticket's number: the store's clock when it joined), and its first
/// estimate is never 0: before any session ended, it says it is a `typical` guess.
#[tokio::test]
async fn the_cluster_queue_shows_whose_each_ticket_is_and_how_long_it_has_waited() {
    if !needs(&[Need::Redis]) {
        return;
    }
    let (_redis, _n1, g1, g2) = two_replicas();
    let held = active(&g1, "audio").await;
    let mut waiting = Client::connect(&g2.url("/v1/realtime?mode=audio")).await;
    let queued = waiting.expect("session.queued").await;
    assert!(queued["estimated_wait_s"].as_f64().unwrap() >= 1.0, "{queued}");
    assert_eq!(queued["estimate"], "typical", "no session has ended yet: {queued}");
    let ticket = queued["ticket_id"].as_str().unwrap().to_string();
    let status = g1.wait_status("g2's ticket, waited a second", WAIT, |s| {
        s["queue"]["tickets"].as_array().unwrap().iter().any(|t| {
            t["ticket_id"] == ticket.as_str() && t["replica"] == "g2" && t["waited_s"].as_f64().unwrap_or(0.0) >= 1.0
        })
    });
    let row = &status["queue"]["tickets"][0];
    assert!(row["waited_s"].as_f64().unwrap() < 30.0, "its own wait, not the store's age: {row}");
    close(held).await;
    waiting.until("session.queue_done").await;
    waiting.close_socket().await;
    g1.wait_idle();
    g2.wait_idle();
}
