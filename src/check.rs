//! `omni-gateway check-config`: a configuration validated as the server would use it: the file,
//! the TLS identities, the listen addresses, the gateway-side models, every backend opened with
//! its options (then closed), the cluster's store and the nodes. What holds is printed on
//! stdout, what fails on stderr with the key to fix.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use omni_backend_host::BackendApi;
use omni_backend_host::workers::WorkerSpec;

use crate::config::{BackendSource, Config, VadSpec};

/// Checks the configuration at `path`; whether it holds.
pub fn config(path: &Path) -> bool {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return false;
        }
    };
    let mut check = Check { file: path.display().to_string(), failed: false };
    check.host(&config);
    check.models(&config);
    check.binds(&config);
    check.workers(&config);
    check.cluster(&config);
    let remote = check.nodes(&config);
    check.node(&config);
    if check.failed {
        return false;
    }
    let file = check.file;
    if config.cluster.is_some() {
        println!("{file}: ok (a replica: its workers are the cluster's nodes')");
    } else if remote > 0 {
        println!("{file}: ok, {} worker(s) here and {remote} on {} node(s)", config.workers.len(), config.nodes.len());
    } else {
        println!("{file}: ok, {} worker(s)", config.workers.len());
    }
    true
}

/// The file checked, and whether anything failed so far.
struct Check {
    file: String,
    failed: bool,
}

impl Check {
    fn fail(&mut self, what: impl std::fmt::Display) {
        eprintln!("{}: {what}", self.file);
        self.failed = true;
    }

    /// Whether this host can hold the workers, and the server's TLS identity.
    fn host(&mut self, config: &Config) {
        if let Err(e) = omni_backend_host::capacity::check(&config.workers, config.node.is_none()) {
            self.fail(e);
        }
        if let Some((cert, key)) = &config.tls
            && let Err(e) = crate::listen::tls_config("server.tls", cert, key)
        {
            self.fail(e);
        }
    }

    /// The gateway's own models: its voice activity detector and its transcription.
    fn models(&mut self, config: &Config) {
        match omni_dialects::vad::check(&config.vad) {
            Ok(()) if config.vad != VadSpec::Energy => println!("{}: vad: Silero VAD loads and runs", self.file),
            Ok(()) => {}
            Err(e) => self.fail(e),
        }
        if let Some(t) = &config.transcription {
            match omni_dialects::transcription::check(t) {
                Ok(()) => println!("{}: transcription: Whisper ({}) loads and runs", self.file, t.model.display()),
                Err(e) => self.fail(format_args!("transcription: {e}")),
            }
        }
        if let Some(d) = &config.delegation {
            println!("{}: {}", self.file, d.describe());
        }
    }

    /// The addresses it will listen on: a node on its `[node]` bind (the server's is not used
    /// by `omni-gateway node`).
    fn binds(&mut self, config: &Config) {
        let (binds, key) = match &config.node {
            Some(node) => (&node.bind, "node.bind"),
            None => (&config.bind, "server.bind"),
        };
        for addr in binds {
            match std::net::TcpListener::bind(addr) {
                Ok(_) => println!("{}: will listen on {addr} (the address is free)", self.file),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    println!("{}: will listen on {addr} (something listens there now: a running server?)", self.file)
                }
                Err(e) => self.fail(format_args!("{key}: {}", crate::listen::listen_error(*addr, &e))),
            }
        }
    }

    /// Every worker entry's backend, opened with its options; the modes it must run.
    fn workers(&mut self, config: &Config) {
        let open_timeout = Duration::from_secs_f64(config.limits.open_timeout_s);
        let mut checked = BTreeSet::new();
        for w in &config.workers {
            // Workers of one entry share their backend and options: one open checks them all.
            if !checked.insert(w.entry) {
                println!("  {} [{}; {}]", w.name, w.source.label(), modes(w));
                continue;
            }
            if let BackendSource::Library(lib) = &w.source
                && let Err(e) = BackendApi::load(lib)
            {
                self.fail(format_args!("workers[{}].library: {e}", w.entry));
                continue;
            }
            self.worker(w, open_timeout);
        }
    }

    fn worker(&mut self, w: &WorkerSpec, open_timeout: Duration) {
        let backend = match omni_backend_host::factory(w, open_timeout).open() {
            Ok(backend) => backend,
            Err(e) => {
                let key = if w.source.url().is_some() { "url" } else { "options" };
                return self.fail(format_args!("workers[{}].{key}: the backend refuses to open: {e}", w.entry));
            }
        };
        let info = backend.info();
        let can: Vec<&str> =
            [(info.duplex, "duplex"), (info.turn, "turn"), (info.vision, "vision"), (info.speech_output, "speech out")]
                .into_iter()
                .filter_map(|(ok, what)| ok.then_some(what))
                .collect();
        println!(
            "  {} [{}; {}]: opened {} ({}; context {})",
            w.name,
            w.source.label(),
            modes(w),
            info.name,
            can.join(", "),
            info.context_size
        );
        for mode in w.modes.iter().filter(|m| !info.supports(m.session_kind())) {
            self.fail(format_args!(
                "workers[{}].modes: {} cannot run {mode} sessions ({})",
                w.entry,
                info.name,
                mode.session_kind().runtime_name()
            ));
        }
    }

    /// The cluster's store, reached as the server would reach it, within a few seconds.
    fn cluster(&mut self, config: &Config) {
        let Some(spec) = &config.cluster else { return };
        let reached = crate::store::redis::RedisStore::from_spec(spec).map_err(|e| e.to_string()).and_then(|store| {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
            runtime.block_on(store.ping(Duration::from_secs(3))).map_err(|e| e.to_string())
        });
        match reached {
            Ok(()) => println!("{}: cluster: the store at {} answers", self.file, spec.redacted_url()),
            Err(e) => self.fail(format_args!("cluster.url: cannot reach the store at {}: {e}", spec.redacted_url())),
        }
        if config.node.is_none() {
            println!(
                "{}: cluster: replica {}: its workers are the cluster's nodes' (in the store)",
                self.file, spec.name
            );
        }
    }

    /// The nodes' workers, asked of each node; how many they serve.
    fn nodes(&mut self, config: &Config) -> usize {
        let mut remote = 0;
        for (i, link) in config.nodes.iter().enumerate() {
            match omni_backend_host::remote::discover(link) {
                Ok(workers) => {
                    println!(
                        "{}: node {} ({}) serves {} worker(s):",
                        self.file,
                        link.name,
                        link.address,
                        workers.len()
                    );
                    for w in &workers {
                        let modes: Vec<&str> = w.modes.iter().map(|m| m.as_str()).collect();
                        let reason = w.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
                        let (node, state) = (&link.name, w.state.as_str());
                        println!("  {node}/{} [{}; {}]: {state}{reason}", w.name, w.backend, modes.join(", "));
                    }
                    remote += workers.len();
                }
                Err(e) => self.fail(format_args!("nodes[{i}]: node {} ({}): {e}", link.name, link.address)),
            }
        }
        remote
    }

    /// As a node: its TLS identity and where it will serve.
    fn node(&mut self, config: &Config) {
        let Some(node) = &config.node else { return };
        if let Some((cert, key)) = &node.tls
            && let Err(e) = crate::listen::tls_config("node.tls", cert, key)
        {
            self.fail(e);
        }
        let addrs: Vec<String> = node.bind.iter().map(|a| a.to_string()).collect();
        println!("{}: as a node (omni-gateway node), will serve its workers on {}", self.file, addrs.join(", "));
    }
}

fn modes(w: &WorkerSpec) -> String {
    w.modes.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", ")
}
