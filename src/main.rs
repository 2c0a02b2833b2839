//! The omni-gateway binary: `omni-gateway [--config PATH] [serve]`, `omni-gateway node`,
//! `omni-gateway check-config [PATH]`, and the tools.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use omni_gateway::config::Config;

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
    // The SIP stack (ezk) logs what anyone may send the SIP port (a junk datagram, at WARN) and
    // a span per request and layer at INFO: off unless RUST_LOG names it
    // (`RUST_LOG=info,ezk_sip_core=debug`). The gateway logs what matters of SIP itself.
    env_logger::Builder::new()
        .filter_level(log::LevelFilter::Info)
        .filter_module("ezk", log::LevelFilter::Off)
        .parse_env(env_logger::Env::default())
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

/// Validates a configuration as the server would use it ([`omni_gateway::check`]).
fn check_config(path: &std::path::Path) -> ExitCode {
    if omni_gateway::check::config(path) { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
