//! Every metric the gateway exports, in one place. `/metrics` renders [`Metrics::render`]
//! in the Prometheus text format. Label values come from fixed sets (modes, dialects,
//! error codes, close reasons, worker states), never from client input.

use std::sync::LazyLock;

use prometheus::{
    CounterVec, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

/// Every metric the gateway exports; one per process, from [`metrics`].
pub struct Metrics {
    registry: Registry,
    /// Every metric's name, in the order defined here (labelled families included, which
    /// `/metrics` only shows once they have a value).
    names: Vec<String>,
    /// WebSocket connections accepted (upgraded), and open now.
    pub connections_total: IntCounter,
    /// WebSocket connections open now.
    pub connections_open: IntGauge,
    /// Connections refused before the upgrade, by reason (unauthorized, forbidden_origin, too_many_connections, ...).
    pub connections_refused: IntCounterVec,
    /// Sessions past `session.created`, by public mode, dialect and transport.
    pub sessions_active: IntGaugeVec,
    /// Clients waiting for a worker (on this replica, in a cluster).
    pub queue_length: IntGauge,
    /// Clients waiting across the cluster (every replica), as last read from the store.
    pub cluster_waiting: IntGauge,
    /// 1 while this replica reaches the cluster's store, 0 when its last beat failed.
    pub cluster_store_up: IntGauge,
    /// Time from the upgrade to `session.queue_done`.
    pub queue_wait_seconds: Histogram,
    /// One backend job: a duplex step, a turn answer, a prepare.
    pub step_duration_seconds: HistogramVec,
    /// Time from the input that starts a spoken answer to its first audio sent.
    pub first_audio_seconds: HistogramVec,
    /// Time from receiving a duplex chunk to sending its answer (the server's share of a round trip).
    pub chunk_latency_seconds: HistogramVec,
    /// Time from a session's end on a worker (its detach) to the next session attached to it:
    /// the reset, the release and the queue's assignment.
    pub worker_handover_seconds: Histogram,
    /// Duplex input chunks received, by mode.
    pub chunks_received: IntCounterVec,
    /// Duplex input chunks dropped unprocessed (the client ran ahead of its worker), by mode.
    pub chunks_dropped: IntCounterVec,
    /// Duplex input chunks answered (a listen or speech sent), by mode.
    pub chunks_answered: IntCounterVec,
    /// `error` events sent, by code.
    pub errors: IntCounterVec,
    /// Sessions ended, by reason.
    pub sessions_closed: IntCounterVec,
    /// WebSocket message bytes received.
    pub bytes_received: IntCounter,
    /// WebSocket message bytes sent.
    pub bytes_sent: IntCounter,
    /// Bytes of clients' messages read and not yet handled by their sessions.
    pub incoming_bytes_waiting: IntGauge,
    /// Bytes sessions wrote that their clients have not taken yet.
    pub outgoing_bytes_waiting: IntGauge,
    /// Bytes the sessions' dialects hold for their clients together (audio not yet committed,
    /// items and images not yet answered, replies held while queued): `limits.max_buffered_total_mb`.
    pub buffered_bytes: IntGauge,
    /// Workers per state.
    pub workers: IntGaugeVec,
    /// Worker restarts, by worker.
    pub worker_restarts: IntCounterVec,
    /// Bytes handed to recorders and not yet written.
    pub recording_lag_bytes: IntGauge,
    /// Records a recording did not take, by reason: `session_lag` (its recorder more than
    /// `recording.max_lag_mb` behind), `total_lag` (all recorders together more than
    /// `recording.max_total_lag_mb` behind), `prelude` (held before the session had an id,
    /// past `max_lag_mb`), `session_cap` (the recording reached `recording.max_session_mb`).
    pub recording_dropped: IntCounterVec,
    /// Sessions closed because they did not read their output.
    pub slow_consumers: IntCounter,
    /// What a client sent over a transport that cannot be held back (a call's voice over UDP,
    /// a data channel's events) and was dropped because its session was behind, by transport
    /// and what it was (`audio`, `event`).
    pub input_dropped: IntCounterVec,
    /// Sessions held now for a client whose connection dropped (their place in the queue or
    /// their worker kept for its resume).
    pub sessions_held: IntGauge,
    /// Resumes, by outcome: `resumed`, `expired` (the grace passed), and the refused ones
    /// (`unknown_token`, `other_key`).
    pub resumes: IntCounterVec,
    /// Client events refused because what the server holds for that client reached its
    /// bound, by buffer (`audio_buffer`, `items`, `images`, `replies`, `turns`, `held_input`).
    pub buffer_refusals: IntCounterVec,
    /// Client messages dropped unprocessed because their connection sent faster than
    /// `server.max_messages_per_s`.
    pub rate_limited: IntCounter,
    /// Full contexts a session went on from: its oldest items dropped, the rest replayed.
    pub context_evictions: IntCounter,
    /// Conversations replayed into a backend that was prepared again (new instructions,
    /// voice or tools, a full context, a refused reconfigure).
    pub conversation_replays: IntCounter,
    /// Function calls the models made.
    pub function_calls: IntCounter,
    /// Function calls the models made that the gateway did not send, by error code
    /// (`tool_not_found`, `invalid_tool_arguments`).
    pub function_calls_refused: IntCounterVec,
    /// Decisions of the decider beside a voice that calls no tools (delegation), by outcome
    /// (`call`, `no_call`, `decider_unavailable`, `decider_timeout`, `decider_invalid_output`).
    pub decisions: IntCounterVec,
    /// How long the decider took, per decision.
    pub decision_seconds: Histogram,
    /// Worker links open to each node (`[[nodes]]`): as many as its workers when it is up.
    pub node_links: IntGaugeVec,
    /// Worker links to a node that failed or ended, by node and reason (`unreachable`,
    /// `outside_networks`, `not_the_node`, `refused`, `heartbeat`, `closed`).
    pub node_link_failures: IntCounterVec,
    /// A node's new connections closed at once: too many connections from strangers (or from
    /// the same address) had not proved the token yet.
    pub node_connections_refused: IntCounter,
    /// A node's handshakes refused (a wrong token, a bad hello, a peer that left mid-way).
    pub node_handshakes_refused: IntCounter,
    /// Client secrets minted.
    pub client_secrets_minted: IntCounter,
    /// 1 while the SIP edge (`[sip]`) reads its port; 0 once it stopped, or with SIP off.
    pub sip_up: IntGauge,
    /// SIP requests the edge's first look dropped or answered itself, by reason: `stranger`
    /// (from outside `sip.allowed_networks`), `rate` (an address past
    /// `max_invites_per_s_per_ip`), `no_dialog`, `dialog_elsewhere` (an in-dialog request from
    /// outside the network entry its call came from), `call_exists` (an INVITE under the
    /// Call-ID of a call here), `method` (a method not served), `busy` (every call's place
    /// taken).
    pub sip_requests_refused: IntCounterVec,
    /// Datagrams on the SIP port discarded before any rule saw them (not SIP, malformed).
    pub sip_messages_discarded: IntCounter,
    /// A cluster replica's grants not dialled because their node did not sign them (no label:
    /// a forged grant names what it likes).
    pub grants_refused: IntCounter,
    /// A cluster replica's attaches of granted workers, by node and link: `kept` (a link
    /// opened ahead of the grant, `cluster.standby_links`) or `opened` (connected for it).
    pub node_attaches: IntCounterVec,
    /// A cluster replica's links kept open ahead of grants, ready now, by node address.
    pub node_standby_links: IntGaugeVec,
    /// Remote MiniCPM-o workers' answers to `/health` (at open and idle checks), by worker and status
    /// (`healthy`, `loading`, `busy`, `error`, `offline`).
    pub remote_worker_health: IntCounterVec,
    /// Session events a subscriber's actor could not take (its mailbox full), by subscriber.
    pub subscriber_dropped: IntCounterVec,
    /// Usage accounting (`[usage]`), by API key id (`anonymous` without keys) and mode:
    /// sessions ended, and what they used.
    pub usage_sessions: IntCounterVec,
    /// Seconds connected.
    pub usage_connected_seconds: CounterVec,
    /// Seconds of audio received.
    pub usage_audio_in_seconds: CounterVec,
    /// Seconds of model speech sent.
    pub usage_audio_out_seconds: CounterVec,
    /// Duplex steps answered and turn-mode answers given.
    pub usage_steps: IntCounterVec,
    /// Webhook deliveries (`[[webhooks]]`), by webhook and outcome: `delivered`, `retried`
    /// (an attempt failed and is tried again), `failed` (every attempt failed), `dropped`
    /// (its queue was full).
    pub webhook_deliveries: IntCounterVec,
}

const LATENCY_BUCKETS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
const WAIT_BUCKETS: &[f64] = &[0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0];

/// The registry being built, and the name of every metric registered in it.
struct Builder {
    registry: Registry,
    names: std::cell::RefCell<Vec<String>>,
}

impl std::ops::Deref for Builder {
    type Target = Registry;
    fn deref(&self) -> &Registry {
        &self.registry
    }
}

impl Builder {
    fn register(&self, name: &str, collector: Box<dyn prometheus::core::Collector>) {
        self.registry.register(collector).expect("unique metric name");
        self.names.borrow_mut().push(name.to_string());
    }
}

fn counter(r: &Builder, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric");
    r.register(name, Box::new(c.clone()));
    c
}

fn counter_vec(r: &Builder, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(name, Box::new(c.clone()));
    c
}

fn float_counter_vec(r: &Builder, name: &str, help: &str, labels: &[&str]) -> CounterVec {
    let c = CounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(name, Box::new(c.clone()));
    c
}

fn gauge(r: &Builder, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid metric");
    r.register(name, Box::new(g.clone()));
    g
}

fn gauge_vec(r: &Builder, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(name, Box::new(g.clone()));
    g
}

fn histogram_vec(r: &Builder, name: &str, help: &str, buckets: &[f64], labels: &[&str]) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels).expect("valid metric");
    r.register(name, Box::new(h.clone()));
    h
}

impl Metrics {
    fn new() -> Metrics {
        let r = Builder { registry: Registry::new(), names: Default::default() };
        let queue_wait_seconds = Histogram::with_opts(
            HistogramOpts::new("omni_queue_wait_seconds", "Time from the upgrade to session.queue_done")
                .buckets(WAIT_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        r.register("omni_queue_wait_seconds", Box::new(queue_wait_seconds.clone()));
        let worker_handover_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "omni_worker_handover_seconds",
                "From a session's end on a worker to the next session attached to it",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        r.register("omni_worker_handover_seconds", Box::new(worker_handover_seconds.clone()));
        let decision_seconds = Histogram::with_opts(
            HistogramOpts::new("omni_decision_seconds", "Time the decider beside a voice took per decision")
                .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        r.register("omni_decision_seconds", Box::new(decision_seconds.clone()));
        Metrics {
            connections_total: counter(&r, "omni_connections_total", "WebSocket connections accepted"),
            connections_open: gauge(&r, "omni_connections_open", "WebSocket connections open now"),
            connections_refused: counter_vec(
                &r,
                "omni_connections_refused_total",
                "Connections refused before the upgrade",
                &["reason"],
            ),
            sessions_active: gauge_vec(
                &r,
                "omni_sessions_active",
                "Sessions past session.created",
                &["mode", "dialect", "transport"],
            ),
            queue_length: gauge(&r, "omni_queue_length", "Clients waiting for a worker"),
            cluster_waiting: gauge(&r, "omni_cluster_waiting", "Clients waiting across the cluster's replicas"),
            cluster_store_up: gauge(&r, "omni_cluster_store_up", "Whether this replica reaches the cluster's store"),
            queue_wait_seconds,
            worker_handover_seconds,
            step_duration_seconds: histogram_vec(
                &r,
                "omni_step_duration_seconds",
                "Duration of one backend job",
                LATENCY_BUCKETS,
                &["kind"],
            ),
            first_audio_seconds: histogram_vec(
                &r,
                "omni_first_audio_latency_seconds",
                "From the input that starts a spoken answer to its first audio sent",
                LATENCY_BUCKETS,
                &["mode"],
            ),
            chunk_latency_seconds: histogram_vec(
                &r,
                "omni_chunk_latency_seconds",
                "From receiving a duplex chunk to sending its answer",
                LATENCY_BUCKETS,
                &["mode"],
            ),
            chunks_received: counter_vec(&r, "omni_chunks_received_total", "Duplex input chunks received", &["mode"]),
            chunks_dropped: counter_vec(
                &r,
                "omni_chunks_dropped_total",
                "Duplex input chunks dropped unprocessed",
                &["mode"],
            ),
            chunks_answered: counter_vec(&r, "omni_chunks_answered_total", "Duplex input chunks answered", &["mode"]),
            errors: counter_vec(&r, "omni_errors_total", "error events sent to clients", &["code"]),
            sessions_closed: counter_vec(&r, "omni_sessions_closed_total", "Sessions ended", &["reason"]),
            bytes_received: counter(&r, "omni_bytes_received_total", "WebSocket message bytes received"),
            bytes_sent: counter(&r, "omni_bytes_sent_total", "WebSocket message bytes sent"),
            incoming_bytes_waiting: gauge(
                &r,
                "omni_incoming_bytes_waiting",
                "Bytes of clients' messages read and not yet handled by their sessions",
            ),
            outgoing_bytes_waiting: gauge(
                &r,
                "omni_outgoing_bytes_waiting",
                "Bytes sessions wrote that their clients have not taken yet",
            ),
            buffered_bytes: gauge(
                &r,
                "omni_buffered_bytes",
                "Bytes the sessions' dialects hold for their clients together",
            ),
            workers: gauge_vec(&r, "omni_workers", "Workers per state", &["state"]),
            worker_restarts: counter_vec(&r, "omni_worker_restarts_total", "Worker restarts", &["worker"]),
            recording_lag_bytes: gauge(&r, "omni_recording_lag_bytes", "Bytes handed to recorders and not yet written"),
            recording_dropped: counter_vec(
                &r,
                "omni_recording_dropped_total",
                "Records a recording did not take",
                &["reason"],
            ),
            sessions_held: gauge(
                &r,
                "omni_sessions_held",
                "Sessions held for a client whose connection dropped, until it resumes or the grace passes",
            ),
            resumes: counter_vec(&r, "omni_resumes_total", "Session resumes, by outcome", &["outcome"]),
            slow_consumers: counter(
                &r,
                "omni_slow_consumers_total",
                "Sessions closed because they did not read their output",
            ),
            input_dropped: counter_vec(
                &r,
                "omni_input_dropped_total",
                "Input a client sent that its session was too far behind to take, dropped at its edge",
                &["transport", "what"],
            ),
            buffer_refusals: counter_vec(
                &r,
                "omni_buffer_refusals_total",
                "Client events refused because a per-client buffer reached its bound",
                &["buffer"],
            ),
            rate_limited: counter(
                &r,
                "omni_rate_limited_messages_total",
                "Client messages dropped because their connection exceeded server.max_messages_per_s",
            ),
            context_evictions: counter(
                &r,
                "omni_context_evictions_total",
                "Full contexts sessions went on from by dropping their oldest items",
            ),
            conversation_replays: counter(
                &r,
                "omni_conversation_replays_total",
                "Conversations replayed into a backend prepared again",
            ),
            function_calls: counter(&r, "omni_function_calls_total", "Function calls the models made"),
            function_calls_refused: counter_vec(
                &r,
                "omni_function_calls_refused_total",
                "Function calls the models made that were not sent: no such tool, or arguments its schema refuses",
                &["code"],
            ),
            decisions: counter_vec(
                &r,
                "omni_decisions_total",
                "Decisions of the decider beside a voice that calls no tools, by outcome",
                &["outcome"],
            ),
            decision_seconds,
            node_links: gauge_vec(&r, "omni_node_links", "Worker links open to a node", &["node"]),
            node_link_failures: counter_vec(
                &r,
                "omni_node_link_failures_total",
                "Worker links to a node that failed or ended",
                &["node", "reason"],
            ),
            node_connections_refused: counter(
                &r,
                "omni_node_connections_refused_total",
                "Connections a node closed at once: too many still had to prove the token",
            ),
            node_handshakes_refused: counter(
                &r,
                "omni_node_handshakes_refused_total",
                "Handshakes a node refused: a wrong token, a bad hello",
            ),
            client_secrets_minted: counter(&r, "omni_client_secrets_minted_total", "Client secrets minted"),
            sip_up: gauge(&r, "omni_sip_up", "Whether the SIP edge reads its port"),
            sip_requests_refused: counter_vec(
                &r,
                "omni_sip_requests_refused_total",
                "SIP requests dropped or answered by the edge's first look, by reason",
                &["reason"],
            ),
            sip_messages_discarded: counter(
                &r,
                "omni_sip_messages_discarded_total",
                "Datagrams on the SIP port discarded unparsed (not SIP, malformed)",
            ),
            grants_refused: counter(
                &r,
                "omni_grants_refused_total",
                "Grants a replica did not dial: their node did not sign them",
            ),
            node_attaches: counter_vec(
                &r,
                "omni_node_attaches_total",
                "Granted workers attached, on a link kept open ahead of the grant or opened for it",
                &["node", "link"],
            ),
            node_standby_links: gauge_vec(
                &r,
                "omni_node_standby_links",
                "Links to a node kept open ahead of grants, ready now",
                &["address"],
            ),
            remote_worker_health: counter_vec(
                &r,
                "omni_remote_worker_health_total",
                "Health checks of remote MiniCPM-o workers and vLLM-Omni servers, by their answer",
                &["worker", "status"],
            ),
            subscriber_dropped: counter_vec(
                &r,
                "omni_subscriber_dropped_total",
                "Session events a subscriber's actor could not take",
                &["subscriber"],
            ),
            usage_sessions: counter_vec(
                &r,
                "omni_usage_sessions_total",
                "Sessions ended, by API key and mode",
                &["key", "mode"],
            ),
            usage_connected_seconds: float_counter_vec(
                &r,
                "omni_usage_connected_seconds_total",
                "Seconds connected, by API key and mode",
                &["key", "mode"],
            ),
            usage_audio_in_seconds: float_counter_vec(
                &r,
                "omni_usage_audio_in_seconds_total",
                "Seconds of audio received, by API key and mode",
                &["key", "mode"],
            ),
            usage_audio_out_seconds: float_counter_vec(
                &r,
                "omni_usage_audio_out_seconds_total",
                "Seconds of audio sent, by API key and mode",
                &["key", "mode"],
            ),
            usage_steps: counter_vec(
                &r,
                "omni_usage_steps_total",
                "Duplex steps answered and turn answers given, by API key and mode",
                &["key", "mode"],
            ),
            webhook_deliveries: counter_vec(
                &r,
                "omni_webhook_deliveries_total",
                "Webhook deliveries, by webhook and outcome",
                &["webhook", "outcome"],
            ),
            names: r.names.take(),
            registry: r.registry,
        }
    }

    /// The name of every metric.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into memory cannot fail for well-formed metrics.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_renders() {
        let m = metrics();
        m.errors.with_label_values(&["not_ready"]).inc();
        m.sessions_active.with_label_values(&["video", "minicpm", "websocket"]).set(1);
        m.queue_wait_seconds.observe(0.2);
        let text = m.render();
        for name in [
            "omni_connections_total",
            "omni_errors_total{code=\"not_ready\"} 1",
            "omni_sessions_active{dialect=\"minicpm\",mode=\"video\",transport=\"websocket\"} 1",
            "omni_queue_wait_seconds_bucket",
            "omni_queue_length",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
    }
}
