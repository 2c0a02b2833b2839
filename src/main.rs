//! The omni-gateway binary: `omni-gateway [--config PATH] [serve]`, `omni-gateway node`,
//! `omni-gateway check-config [PATH]`, and the tools.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use omni_backend_host::BackendApi;
use omni_gateway::config::{BackendSource, Config};

#[derive(Parser)]
#[command(name = "omni-gateway", version, about = "Realtime WebSocket gateway for omni models")]
struct Cli {
    /// The configuration file.
    #[arg(long, global = true, env = "OMNI_GATEWAY_CONFIG", default_value = "config.toml")]
    config: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (the default).
    Serve,
    /// Serve this host's [[workers]] to gateways over the network (the config's [node]
    /// section: bind, token); gateways list it under [[nodes]].
    Node,
    /// Validate a configuration file (and load every backend library it names); exit 0 or 1.
    CheckConfig {
        /// The file to check; defaults to --config.
        path: Option<PathBuf>,
    },
    /// Issue the credential of a cluster's replica NAME from this node's config ([node] token):
    /// printed on stdout, for that replica's [cluster] credential.
    ReplicaCredential {
        /// The replica's name ([cluster] name on it; letters, digits, '_', '.', '-').
        name: String,
    },
    /// One session against a server, printed as it goes (see --help).
    Probe(omni_tools::probe::ProbeArgs),
    /// Many concurrent sessions against a server, measured (see --help).
    Loadgen(omni_tools::loadgen::LoadgenArgs),
    /// Voice sessions over WebRTC calls or WebSockets, measured side by side (bytes, delays).
    Callload(omni_tools::callload::CallloadArgs),
    /// Hostile load against a server: connection churn, chunk and tiny-frame floods, oversized frames.
    Flood(omni_tools::flood::FloodArgs),
    /// Verify every recorded session in a recordings directory; exit 0 or 1.
    CheckRecordings(omni_tools::check_recordings::CheckRecordingsArgs),
    /// Hosts one worker's backend in this process, spoken to over stdin and stdout
    /// (started by the server for workers with isolation = "process").
    #[command(hide = true)]
    WorkerHost(omni_backend_host::host::HostArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_micros()
        .init();
    if matches!(cli.command, None | Some(Command::Serve | Command::Node)) {
        raise_descriptor_limit();
    }
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => match load_for_this_host(&cli.config, true).and_then(|config| {
            let file = cli.config.display();
            omni_dialects::vad::check(&config.vad).map_err(|e| format!("{file}: {e}"))?;
            if let Some(t) = &config.transcription {
                omni_dialects::transcription::check(t).map_err(|e| format!("{file}: transcription: {e}"))?;
            }
            Ok(config)
        }) {
            Ok(config) => report(omni_gateway::http::run(config)),
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Node => match load_for_this_host(&cli.config, false) {
            Ok(config) => report(omni_gateway::roles::node::run(config)),
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::CheckConfig { path } => check_config(&path.unwrap_or(cli.config)),
        Command::ReplicaCredential { name } => replica_credential(&cli.config, &name),
        Command::Probe(args) => report(omni_tools::probe::run(args)),
        Command::Loadgen(args) => report(omni_tools::loadgen::run(args)),
        Command::Callload(args) => report(omni_tools::callload::run(args)),
        Command::Flood(args) => report(omni_tools::flood::run(args)),
        Command::CheckRecordings(args) => report(omni_tools::check_recordings::run(args)),
        Command::WorkerHost(args) => report(omni_backend_host::host::run(args)),
    }
}

/// Prints replica `name`'s credential, issued under the `[node] token` of the config at `path`.
fn replica_credential(path: &std::path::Path, name: &str) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(node) = &config.node else {
        eprintln!("{}: a credential is issued from a node's config (its [node] token)", path.display());
        return ExitCode::FAILURE;
    };
    if !omni_backend_host::link::replica::name_ok(name) {
        eprintln!("'{}' is not a replica's name: up to 64 letters, digits, '_', '.' and '-'", name.escape_debug());
        return ExitCode::FAILURE;
    }
    println!("{}", omni_backend_host::link::replica::issue(&node.token, name));
    ExitCode::SUCCESS
}

/// The configuration, refused when this host cannot hold its workers
/// ([`omni_gateway::config::host`]) rather than aborting while it opens them.
fn load_for_this_host(path: &std::path::Path, inline: bool) -> Result<Config, String> {
    let config = Config::load(path).map_err(|e| e.to_string())?;
    omni_backend_host::capacity::check(&config.workers, inline).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(config)
}

/// A server holds a descriptor per connection: the soft limit goes up to the hard one (a
/// systemd unit's soft limit is 1,024; its hard limit, 524,288).
fn raise_descriptor_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => log::debug!("open files: up to {n}"),
        Err(e) => log::warn!("cannot raise the open-file limit: {e}"),
    }
}

fn report<E: std::fmt::Display>(result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("omni-gateway: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Validates a configuration as the server would use it: the file, the TLS identity, the
/// listen addresses, and every backend opened with its options (then closed).
fn check_config(path: &std::path::Path) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let file = path.display();
    let mut failed = false;
    if let Err(e) = omni_backend_host::capacity::check(&config.workers, config.node.is_none()) {
        eprintln!("{file}: {e}");
        failed = true;
    }
    if let Some((cert, key)) = &config.tls
        && let Err(e) = omni_gateway::listen::tls_config("server.tls", cert, key)
    {
        eprintln!("{file}: {e}");
        failed = true;
    }
    match omni_dialects::vad::check(&config.vad) {
        Ok(()) if config.vad != omni_gateway::config::VadSpec::Energy => {
            println!("{file}: vad: Silero VAD loads and runs")
        }
        Ok(()) => {}
        Err(e) => {
            eprintln!("{file}: {e}");
            failed = true;
        }
    }
    if let Some(t) = &config.transcription {
        match omni_dialects::transcription::check(t) {
            Ok(()) => println!("{file}: transcription: Whisper ({}) loads and runs", t.model.display()),
            Err(e) => {
                eprintln!("{file}: transcription: {e}");
                failed = true;
            }
        }
    }
    // A node listens on its [node] bind (the server's is not used by `omni-gateway node`).
    let (binds, key) = match &config.node {
        Some(node) => (node.bind.clone(), "node.bind"),
        None => (config.bind.clone(), "server.bind"),
    };
    for addr in &binds {
        match std::net::TcpListener::bind(addr) {
            Ok(_) => println!("{file}: will listen on {addr} (the address is free)"),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                println!("{file}: will listen on {addr} (something listens there now: a running server?)")
            }
            Err(e) => {
                eprintln!("{file}: {key}: {}", omni_gateway::listen::listen_error(*addr, &e));
                failed = true;
            }
        }
    }
    let open_timeout = std::time::Duration::from_secs_f64(config.limits.open_timeout_s);
    let mut checked = std::collections::BTreeSet::new();
    for w in &config.workers {
        let source = w.source.label();
        let modes: Vec<&str> = w.modes.iter().map(|m| m.as_str()).collect();
        // Workers of one entry share their backend and options: one open checks them all.
        if !checked.insert(w.entry) {
            println!("  {} [{}; {}]", w.name, source, modes.join(", "));
            continue;
        }
        if let BackendSource::Library(lib) = &w.source
            && let Err(e) = BackendApi::load(lib)
        {
            eprintln!("{file}: workers[{}].library: {e}", w.entry);
            failed = true;
            continue;
        }
        let factory = omni_backend_host::factory(w, open_timeout);
        match factory.open() {
            Ok(backend) => {
                let info = backend.info();
                let serves = |ok: bool, what: &str| if ok { Some(what.to_string()) } else { None };
                let can: Vec<String> = [
                    serves(info.duplex, "duplex"),
                    serves(info.turn, "turn"),
                    serves(info.vision, "vision"),
                    serves(info.speech_output, "speech out"),
                ]
                .into_iter()
                .flatten()
                .collect();
                println!(
                    "  {} [{}; {}]: opened {} ({}; context {})",
                    w.name,
                    source,
                    modes.join(", "),
                    info.name,
                    can.join(", "),
                    info.context_size
                );
                for mode in &w.modes {
                    if !info.supports(mode.session_kind()) {
                        eprintln!(
                            "{file}: workers[{}].modes: {} cannot run {mode} sessions ({})",
                            w.entry,
                            info.name,
                            mode.session_kind().runtime_name()
                        );
                        failed = true;
                    }
                }
            }
            Err(e) => {
                let key = if w.source.url().is_some() { "url" } else { "options" };
                eprintln!("{file}: workers[{}].{key}: the backend refuses to open: {e}", w.entry);
                failed = true;
            }
        }
    }
    if let Some(spec) = &config.cluster {
        // The store is reached as the server would reach it, within a few seconds.
        let reached =
            omni_gateway::store::redis::RedisStore::from_spec(spec).map_err(|e| e.to_string()).and_then(|store| {
                let runtime =
                    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
                runtime.block_on(store.ping(std::time::Duration::from_secs(3))).map_err(|e| e.to_string())
            });
        match reached {
            Ok(()) => println!("{file}: cluster: the store at {} answers", spec.redacted_url()),
            Err(e) => {
                eprintln!("{file}: cluster.url: cannot reach the store at {}: {}", spec.redacted_url(), e);
                failed = true;
            }
        }
        if config.node.is_none() {
            println!("{file}: cluster: replica {}: its workers are the cluster's nodes' (in the store)", spec.name);
        }
    }
    let mut remote = 0;
    for (i, link) in config.nodes.iter().enumerate() {
        match omni_backend_host::remote::discover(link) {
            Ok(workers) => {
                println!("{file}: node {} ({}) serves {} worker(s):", link.name, link.address, workers.len());
                for w in &workers {
                    let modes: Vec<&str> = w.modes.iter().map(|m| m.as_str()).collect();
                    let reason = w.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
                    println!(
                        "  {}/{} [{}; {}]: {}{reason}",
                        link.name,
                        w.name,
                        w.backend,
                        modes.join(", "),
                        w.state.as_str()
                    );
                }
                remote += workers.len();
            }
            Err(e) => {
                eprintln!("{file}: nodes[{i}]: node {} ({}): {e}", link.name, link.address);
                failed = true;
            }
        }
    }
    if let Some(node) = &config.node {
        if let Some((cert, key)) = &node.tls
            && let Err(e) = omni_gateway::listen::tls_config("node.tls", cert, key)
        {
            eprintln!("{file}: {e}");
            failed = true;
        }
        let addrs: Vec<String> = node.bind.iter().map(|a| a.to_string()).collect();
        println!("{file}: as a node (omni-gateway node), will serve its workers on {}", addrs.join(", "));
    }
    if failed {
        return ExitCode::FAILURE;
    }
    if config.cluster.is_some() {
        println!("{file}: ok (a replica: its workers are the cluster's nodes')");
    } else if remote > 0 {
        println!("{file}: ok, {} worker(s) here and {remote} on {} node(s)", config.workers.len(), config.nodes.len());
    } else {
        println!("{file}: ok, {} worker(s)", config.workers.len());
    }
    ExitCode::SUCCESS
}
