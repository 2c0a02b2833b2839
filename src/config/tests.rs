//! The configuration's rules, one test per key family.

use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("config.toml"))
}

fn error(text: &str) -> String {
    parse(text).expect_err("expected a config error").to_string()
}

const MINIMAL: &str = "[[workers]]\nname = \"sim\"\n";

#[test]
fn defaults_fill_every_section() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.bind, vec!["127.0.0.1:8006".parse().unwrap()]);
    assert_eq!(c.server.max_frame_bytes, 4_194_304);
    assert_eq!(c.queue, QueueConfig::default());
    assert_eq!((c.queue.max_waiting, c.queue.update_interval_s), (1000, 3.0));
    assert_eq!(c.queue.typical(Mode::Chat), Duration::from_secs(60), "not the 600 s limit");
    assert_eq!(c.limits, LimitsConfig::default());
    assert_eq!(c.limits.session_limit(Mode::Video), Duration::from_secs(300));
    assert_eq!(c.workers.len(), 1);
    let w = &c.workers[0];
    assert_eq!(w.name, "sim-0");
    assert_eq!(w.source, BackendSource::Builtin);
    assert_eq!(w.isolation, Isolation::Thread);
    assert_eq!(w.modes, vec![Mode::Chat, Mode::Video, Mode::Audio]);
}

#[test]
fn count_expands_into_numbered_workers_with_text_options() {
    let c = parse(
        "[[workers]]\nname = \"gpu\"\ncount = 3\nmodes = [\"video\", \"audio\"]\n\
         [workers.options]\nstep_ms = 20\nvad_threshold = 0.05\nverbose = true\nvoice = \"x\"\n",
    )
    .unwrap();
    let names: Vec<_> = c.workers.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names, ["gpu-0", "gpu-1", "gpu-2"]);
    assert_eq!(c.workers[2].modes, vec![Mode::Video, Mode::Audio]);
    assert_eq!(
        c.workers[0].options,
        vec![
            ("step_ms".to_string(), "20".to_string()),
            ("vad_threshold".into(), "0.05".into()),
            ("verbose".into(), "true".into()),
            ("voice".into(), "x".into()),
        ]
    );
    assert_eq!(c.served_modes(), vec![Mode::Video, Mode::Audio]);
}

#[test]
fn the_worker_list_is_required() {
    let none = "config.toml: workers: at least one [[workers]] or [[nodes]] entry is required";
    assert_eq!(error("[server]\nbind = \"127.0.0.1:1\"\n"), none);
    assert_eq!(error("workers = []\n"), none);
}

#[test]
fn nodes_and_the_node_role_are_checked() {
    let token = "token = \"Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkMq3V8r7lWm0=\"";
    let c = parse(&format!("[[nodes]]\naddress = \"gpu1:7100\"\n{token}\n")).unwrap();
    assert!(c.workers.is_empty());
    assert_eq!((c.nodes[0].name.as_str(), c.nodes[0].server_name.as_str()), ("gpu1", "gpu1"));
    assert_eq!(c.nodes[0].heartbeat_timeout, Duration::from_secs(5));
    let cases = [
        (
            "[[nodes]]\naddress = \"gpu1\"\ntoken = \"Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkMq3V8r7lWm0=\"\n",
            "nodes[0].address: 'gpu1' is not HOST:PORT",
        ),
        ("[[nodes]]\naddress = \"gpu1:7100\"\ntoken = \"short\"\n", "nodes[0].token: a key must be at least 16 bytes"),
        (
            "[[nodes]]\naddress = \"gpu1:7100\"\ntoken = \"Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkMq3V8r7lWm0=\"\nheartbeat_timeout_s = 0.5\n",
            "nodes[0].heartbeat_timeout_s: must be longer than heartbeat_interval_s",
        ),
        (
            "[[nodes]]\naddress = \"gpu1:7100\"\ntoken = \"Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkMq3V8r7lWm0=\"\n[[nodes]]\naddress = \"gpu1:7200\"\ntoken = \"Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkMq3V8r7lWm0=\"\n",
            "nodes[1].name: 'gpu1' names two nodes",
        ),
        ("[node]\nbind = \"127.0.0.1:7100\"\n[[workers]]\n", "node.token: is required"),
        ("[[workers]]\nbackend = \"minicpmo-worker\"\n", "workers[0].url: required with backend = \"minicpmo-worker\""),
        (
            "[[workers]]\nbackend = \"minicpmo-worker\"\nurl = \"ws://gpu1:22400\"\n",
            "workers[0].url: 'ws://gpu1:22400' must start with http://",
        ),
        (
            "[[workers]]\nurl = \"http://gpu1:22400\"\n",
            "workers[0].url: only allowed with backend = \"minicpmo-worker\" or \"vllm-omni\"",
        ),
    ];
    for (text, expected) in cases {
        let e = error(text);
        assert!(e.starts_with(&format!("config.toml: {expected}")), "{text}\n=> {e}");
    }
    let c = parse("[[workers]]\nbackend = \"minicpmo-worker\"\nurl = \"http://gpu1:22400/\"\n").unwrap();
    assert_eq!(c.workers[0].source, BackendSource::MinicpmoWorker("http://gpu1:22400".into()));
    for (text, expected) in [
        (
            "[[workers]]\nbackend = \"vllm-omni\"\nurl = \"http://gpu2:8099\"\ncount = 4\n",
            "workers[0].options.ref_audio: required with backend = \"vllm-omni\"",
        ),
        (
            "[[workers]]\nbackend = \"vllm-omni\"\nurl = \"http://gpu2:8099\"\nmodes = [\"audio\", \"chat\"]\n",
            "workers[0].modes[1]: a vllm-omni slot runs duplex sessions only",
        ),
        ("[[workers]]\nbackend = \"vllm-omni\"\n", "workers[0].url: required with backend = \"vllm-omni\""),
        (
            "[[workers]]\nbackend = \"vllm-omni\"\nurl = \"http://gpu2:8099\"\nisolation = \"process\"\n",
            "workers[0].isolation: not for a vllm-omni",
        ),
        (
            "[[workers]]\nbackend = \"vllm-omni\"\nurl = \"http://gpu2:8099\"\n[workers.options]\nref_audio = \"nowhere.wav\"\n",
            "workers[0].options.ref_audio: no such file",
        ),
    ] {
        let e = error(text);
        assert!(e.starts_with(&format!("config.toml: {expected}")), "{text}\n=> {e}");
    }
}

#[test]
fn the_cluster_section_is_checked() {
    let url = "url = \"redis://:secret@10.0.0.2:6379/0\"";
    let secret = "Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkMq3V8r7lWm0=";
    let token = format!("token = \"{secret}\"");
    let cred = format!("credential = \"{}\"", omni_backend_host::link::replica::issue(secret, "gw-a"));
    // A replica: no workers of its own, its own credential (its name is the credential's).
    let c = parse(&format!("[cluster]\nengine = \"redis\"\n{url}\n{cred}\nname = \"gw-a\"\n")).unwrap();
    let spec = c.cluster.unwrap();
    assert_eq!((spec.name.as_str(), spec.prefix.as_str(), spec.lease), ("gw-a", "og", Duration::from_secs(3)));
    assert_eq!(spec.redacted_url(), "redis://***@10.0.0.2:6379/***", "no password in logs");
    assert_eq!(omni_actors::settings::redacted_url("https://hooks.example/t0k3n?sig=1"), "https://hooks.example/***");
    assert_eq!(omni_actors::settings::redacted_url("http://u:p@h:80"), "http://***@h:80");
    assert_eq!(spec.standby_links, 4, "links kept open to each node by default");
    assert!(c.workers.is_empty());
    assert_eq!(spec.credential.unwrap().password(), omni_backend_host::link::replica::password(secret, "gw-a"));
    let c = parse(&format!("[cluster]\nengine = \"redis\"\n{url}\n{cred}\n")).unwrap();
    assert_eq!(c.cluster.unwrap().name, "gw-a", "named by its credential");
    // A node: its workers, its own token; none needed under [cluster].
    let node = format!("[node]\n{token}\n[cluster]\nengine = \"redis\"\n{url}\n{MINIMAL}");
    let c = parse(&node).unwrap();
    let spec = c.cluster.unwrap();
    assert!(spec.name.contains('-'), "default name HOSTNAME-PID");
    assert!(spec.credential.is_none());
    let revoking = node.replace("[cluster]\n", "[cluster]\nrevoked_replicas = [\"gw-b\"]\n");
    assert_eq!(parse(&revoking).unwrap().cluster.unwrap().revoked_replicas, ["gw-b"]);
    assert!(parse("[cluster]\nengine = \"none\"\n[[workers]]\n").unwrap().cluster.is_none());
    // Sentinels: the store is the master they name.
    let sentinels = "sentinels = [\"10.0.0.5:26379\", \"sentinel-2:26379\", \"rediss://:pw@s3:26380\"]\nsentinel_master = \"store\"";
    let c = parse(&format!("[cluster]\nengine = \"redis\"\n{url}\n{cred}\n{sentinels}\n")).unwrap();
    let spec = c.cluster.unwrap();
    assert_eq!((spec.sentinels.len(), spec.sentinel_master.as_str()), (3, "store"));
    let cases = [
        (
            format!("[cluster]\nengine = \"redis\"\n{url}\n{cred}\nsentinels = [\"10.0.0.5\"]\n"),
            "cluster.sentinels[0]: is neither HOST:PORT nor a redis:// URL",
        ),
        (
            format!("[cluster]\nengine = \"redis\"\n{url}\n{cred}\nsentinels = [\"a:1\"]\nsentinel_master = \"\"\n"),
            "cluster.sentinel_master: names the master",
        ),
        ("[cluster]\nengine = \"etcd\"\n".to_string(), "cluster.engine: 'etcd' is not one of: none, redis"),
        ("[cluster]\nengine = \"redis\"\n".to_string(), "cluster.url: is required"),
        (format!("[cluster]\nengine = \"redis\"\n{url}\n"), "cluster.credential: is required on a replica"),
        (
            format!("[cluster]\nengine = \"redis\"\n{url}\n{cred}\n{token}\n"),
            "cluster.token: a replica holds its own credential, not the nodes' token",
        ),
        (
            format!("[cluster]\nengine = \"redis\"\n{url}\n{cred}\nname = \"gw-b\"\n"),
            "cluster.name: 'gw-b', and the credential is replica 'gw-a''s",
        ),
        (
            format!("[cluster]\nengine = \"redis\"\n{url}\n{cred}\ncredential_file = \"x\"\n"),
            "cluster.credential: and credential_file: one of them",
        ),
        (
            format!("[cluster]\nengine = \"redis\"\n{url}\ncredential = \"{secret}\"\n"),
            "cluster.credential: is not a replica credential",
        ),
        (
            format!("{node}\n").replace("[cluster]\n", "[cluster]\nrevoked_replicas = [\"a b\"]\n"),
            "cluster.revoked_replicas: 'a b' is not a replica's name",
        ),
        (format!("[cluster]\nengine = \"redis\"\n{url}\n{cred}\n{MINIMAL}"), "cluster: a replica of a cluster serves"),
        (
            format!("[cluster]\nengine = \"redis\"\n{url}\n{cred}\nlease_s = 0\n"),
            "cluster.lease_s: must be greater than 0",
        ),
        (node.replace("[cluster]\n", "[cluster]\nname = \"a b\"\n"), "cluster.name: 'a b' must use only"),
        (format!("[cluster]\nengine = \"redis\"\n{url}\n{cred}\nprefix = \"{{x}}\"\n"), "cluster.prefix: must be"),
        (
            format!("[cluster]\nengine = \"redis\"\n{url}\n{cred}\nstandby_links = 65\n"),
            "cluster.standby_links: 65 is over 64",
        ),
        (
            format!("[cluster]\nengine = \"redis\"\n{url}\n{cred}\nnode_networks = [\"10.0.0.0/8\", \"10.1/16\"]\n"),
            "cluster.node_networks: '10.1/16' is neither ADDRESS/BITS",
        ),
        (
            format!("[cluster]\nengine = \"redis\"\n{url}\n{cred}\nredis_ca = \"ca.pem\"\n"),
            "cluster.redis_ca: verifies the store's TLS: the url must be rediss://",
        ),
    ];
    for (text, expected) in cases {
        let e = error(&text);
        assert!(e.starts_with(&format!("config.toml: {expected}")), "{text}\n=> {e}");
    }
    // A secret put where a credential goes is not echoed back.
    let e = error(&format!("[cluster]\nengine = \"redis\"\n{url}\ncredential = \"{secret}\"\n"));
    assert!(e.contains("cluster.credential") && !e.contains(secret), "{e}");
}

/// A value in the wrong place may be a secret: errors name the key and the line, not the value.
#[test]
fn an_error_never_echoes_the_value_that_may_be_a_secret() {
    let secret = "sk-live-Qf4mT8zL1vN6rB3xK9cW2pH7";
    let cases = [
        // A key where a list, a number or a table goes.
        (format!("[auth]\napi_keys = \"{secret}\"\n[[workers]]\n"), "invalid type: string, expected a sequence"),
        (format!("[queue]\nmax_waiting = \"{secret}\"\n[[workers]]\n"), "invalid type: string, expected"),
        (format!("[[workers]]\noptions = \"{secret}\"\n"), "invalid type: string, expected"),
        // A URL with its password, mistyped.
        (
            format!("[cluster]\nengine = \"redis\"\nurl = \"redis://x\"\nsentinels = [\"redis//:{secret}@s1\"]\n"),
            "cluster.sentinels[0]: is neither HOST:PORT",
        ),
        (
            format!("[[workers]]\nbackend = \"minicpmo-worker\"\nurl = \"http://u:{secret}@gpu1:22400/x\"\n"),
            "with no path",
        ),
    ];
    for (text, expected) in cases {
        let e = error(&text);
        assert!(e.contains(expected), "{text}\n=> {e}");
        assert!(!e.contains(secret), "the value is echoed: {e}");
    }
}

#[test]
fn unknown_keys_are_errors_naming_the_key() {
    let e = error("[server]\nbnd = \"x\"\n[[workers]]\n");
    assert!(e.starts_with("config.toml: server.bnd: unknown key (expected"), "{e}");
    let e = error("[[workers]]\nname = \"a\"\ncolour = 1\n");
    assert!(e.starts_with("config.toml: workers[0].colour: unknown key"), "{e}");
    let e = error("[nope]\n[[workers]]\n");
    assert!(e.starts_with("config.toml: nope: unknown key"), "{e}");
}

#[test]
fn wrong_types_name_the_key_and_position() {
    let e = error("[queue]\nmax_waiting = \"many\"\n[[workers]]\n");
    assert!(e.starts_with("config.toml: queue.max_waiting: invalid type: string, expected"), "{e}");
    assert!(e.contains("line 2"), "{e}");
    let e = error("[[workers]]\nbackend = \"gpu\"\n");
    assert!(e.starts_with("config.toml: workers[0].backend: unknown variant, expected one of"), "{e}");
}

#[test]
fn syntax_errors_give_the_line() {
    let e = error("[server\n");
    assert!(e.starts_with("config.toml: ") && e.contains("line 1"), "{e}");
}

#[test]
fn library_rules() {
    // A bare name is resolved against the config file's directory, made absolute: the
    // file checked is the file loaded (never one a loader finds on LD_LIBRARY_PATH).
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(
        error("[[workers]]\nname = \"a\"\n[[workers]]\nname = \"b\"\nbackend = \"library\"\nlibrary = \"nope.so\"\n"),
        format!("config.toml: workers[1].library: no such file: {}", cwd.join("nope.so").display())
    );
    assert_eq!(
        error("[[workers]]\nbackend = \"library\"\n"),
        "config.toml: workers[0].library: required with backend = \"library\""
    );
    assert_eq!(
        error("[[workers]]\nlibrary = \"x.so\"\n"),
        "config.toml: workers[0].library: only allowed with backend = \"library\""
    );
}

#[test]
fn a_relative_library_resolves_against_the_config_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("libx.so"), b"").unwrap();
    let cfg = dir.path().join("gw.toml");
    let c = Config::parse("[[workers]]\nbackend = \"library\"\nlibrary = \"libx.so\"\n", &cfg).unwrap();
    assert_eq!(c.workers[0].source, BackendSource::Library(dir.path().join("libx.so")));
    assert_eq!(c.workers[0].isolation, Isolation::Process, "a library runs in a process by default");
}

#[test]
fn worker_value_checks() {
    assert_eq!(error("[[workers]]\ncount = 0\n"), "config.toml: workers[0].count: must be at least 1");
    assert_eq!(
        error("[[workers]]\nmodes = []\n"),
        "config.toml: workers[0].modes: must name at least one of chat, video, audio"
    );
    assert_eq!(
        error("[[workers]]\nmodes = [\"chat\", \"tv\"]\n"),
        "config.toml: workers[0].modes[1]: unknown mode 'tv' (expected chat, video or audio)"
    );
    assert_eq!(
        error("[[workers]]\nname = \"a b\"\n"),
        "config.toml: workers[0].name: 'a b' must be non-empty and use only letters, digits, '_', '.' and '-'"
    );
    assert_eq!(
        error("[[workers]]\nname = \"a\"\n[[workers]]\nname = \"a\"\n"),
        "config.toml: workers[1].name: worker name a-0 is used twice"
    );
    assert_eq!(
        error("[[workers]]\n[workers.options]\nlist = [1]\n"),
        "config.toml: workers[0].options.list: must be a string, a number or a boolean"
    );
}

#[test]
fn section_value_checks() {
    assert_eq!(
        error("[server]\nbind = \"localhost\"\n[[workers]]\n"),
        "config.toml: server.bind: 'localhost' is not HOST:PORT (e.g. 127.0.0.1:8006 or localhost:8006)"
    );
    let named = parse("[server]\nbind = \"localhost:8006\"\n[[workers]]\n").unwrap();
    assert!(named.bind.iter().all(|a| a.ip().is_loopback() && a.port() == 8006) && !named.bind.is_empty());
    assert!(
        error("[server]\nbind = \"no-such-host.invalid:8006\"\n[[workers]]\n")
            .starts_with("config.toml: server.bind: 'no-such-host.invalid:8006': cannot resolve")
    );
    assert_eq!(
        error("[server]\nmax_frame_bytes = 10\n[[workers]]\n"),
        "config.toml: server.max_frame_bytes: must be at least 1024"
    );
    assert_eq!(
        error("[server]\nheartbeat_interval_s = 10\nheartbeat_timeout_s = 5\n[[workers]]\n"),
        "config.toml: server.heartbeat_timeout_s: must be longer than server.heartbeat_interval_s"
    );
    for key in [
        "server]\nheartbeat_interval_s",
        "queue]\nupdate_interval_s",
        "limits]\nchat_session_s",
        "limits]\nvideo_session_s",
        "limits]\naudio_session_s",
        "limits]\ncontext_tokens",
        "limits]\nmin_audio_samples",
        "limits]\nmax_pending_chunks",
        "limits]\nstep_timeout_ms",
    ] {
        let e = error(&format!("[{key} = 0\n[[workers]]\n"));
        let dotted = key.replace("]\n", ".");
        assert_eq!(e, format!("config.toml: {dotted}: must be greater than 0"));
    }
}

#[test]
fn operations_sections() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keys.txt"), "# team keys\nk2#with-a-hash-000\n\n  k3-the-third-key-0  \n").unwrap();
    let cfg = dir.path().join("gw.toml");
    let c = Config::parse(
        "[auth]\napi_keys = [\"k1-the-first-key-00\"]\napi_keys_file = \"keys.txt\"\nadmin_key = \"root-admin-key-0000\"\n\
         [recording]\nenabled = true\ndir = \"rec\"\n[server]\nallowed_origins = [\"https://app.example\"]\n[[workers]]\n",
        &cfg,
    )
    .unwrap();
    assert_eq!(
        c.api_keys,
        ["k1-the-first-key-00", "k2#with-a-hash-000", "k3-the-third-key-0"],
        "# only starts a comment"
    );
    assert_eq!(c.admin_key.as_deref(), Some("root-admin-key-0000"));
    std::fs::write(dir.path().join("keys.txt"), "replaced-key-00000001\n").unwrap();
    assert_eq!(c.reload_api_keys().unwrap(), ["k1-the-first-key-00", "replaced-key-00000001"]);
    std::fs::write(dir.path().join("keys.txt"), "short\n").unwrap();
    assert!(
        c.reload_api_keys()
            .unwrap_err()
            .to_string()
            .ends_with("keys.txt: line 1: a key must be at least 16 bytes (this one has 5)")
    );
    assert_eq!(
        error("[auth]\nadmin_key = \" padded-admin-key-00 \"\n[[workers]]\n"),
        "config.toml: auth.admin_key: has spaces around it: remove them"
    );
    assert_eq!(
        error("[auth]\nadmin_key = \"adm\"\n[[workers]]\n"),
        "config.toml: auth.admin_key: a key must be at least 16 bytes (this one has 3)"
    );
    assert!(c.recording.enabled);
    assert_eq!(c.recording.dir, dir.path().join("rec"));
    assert_eq!(c.server.shutdown_grace_s, 10.0);
    assert_eq!(c.tls, None);

    assert_eq!(
        error("[auth]\napi_keys_file = \"/nonexistent/keys\"\n[[workers]]\n").split(" (").next().unwrap(),
        "config.toml: auth.api_keys_file: cannot read /nonexistent/keys: No such file or directory"
    );
    assert_eq!(
        error("[auth]\napi_keys = [\"long-enough-key-0001\", \"has space but long enough\"]\n[[workers]]\n"),
        "config.toml: auth.api_keys[1]: a key must not contain spaces"
    );
    assert_eq!(
        error("[server.tls]\ncert = \"c.pem\"\n[[workers]]\n"),
        "config.toml: server.tls.key: required with server.tls.cert"
    );
    assert_eq!(
        error("[server.tls]\ncert = \"/nope/c.pem\"\nkey = \"/nope/k.pem\"\n[[workers]]\n"),
        "config.toml: server.tls.cert: no such file: /nope/c.pem"
    );
    assert_eq!(
        error("[server]\nallowed_origins = [\"example.com\"]\n[[workers]]\n"),
        "config.toml: server.allowed_origins[0]: 'example.com' is not an origin like https://example.com"
    );
    assert_eq!(
        error("[recording]\nretention_days = -1\n[[workers]]\n"),
        "config.toml: recording.retention_days: must not be negative"
    );
    assert!(
        error("[recording]\nenable = true\n[[workers]]\n").starts_with("config.toml: recording.enable: unknown key")
    );
}

#[test]
fn models_map_names_to_modes() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.model_mode("anything"), Some(Mode::Audio), "no [[models]]: any name");
    let c = parse(
        "[[models]]\nname = \"omni\"\n[[models]]\nname = \"omni-video\"\nmodes = [\"video\", \"audio\"]\n[[workers]]\n",
    )
    .unwrap();
    assert_eq!(
        (c.model_mode("omni"), c.model_mode("omni-video"), c.model_mode("gpt")),
        (Some(Mode::Audio), Some(Mode::Video), None)
    );
    assert_eq!(
        error("[[models]]\nname = \"a\"\n[[models]]\nname = \"a\"\n[[workers]]\n"),
        "config.toml: models[1].name: 'a' is listed twice"
    );
    assert_eq!(
        error("[[models]]\nname = \"a\"\nmodes = [\"video\"]\n[[workers]]\nmodes = [\"chat\"]\n"),
        "config.toml: models[0].modes: no worker serves video"
    );
    assert!(
        error("[[models]]\nname = \"a\"\nmodes = [\"tv\"]\n[[workers]]\n")
            .starts_with("config.toml: models[0].modes[0]: unknown mode")
    );
}

#[test]
fn an_unreadable_file_is_named() {
    let e = Config::load(Path::new("/nonexistent/gw.toml")).unwrap_err().to_string();
    assert!(e.starts_with("/nonexistent/gw.toml: cannot read:"), "{e}");
}

#[test]
fn the_shipped_config_is_valid_and_documents_every_key() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let c = Config::parse(&text, &path).unwrap();
    assert_eq!(c.bind, vec!["127.0.0.1:8006".parse().unwrap()]);
    for key in [
        "bind",
        "max_frame_bytes",
        "max_outgoing_bytes",
        "heartbeat_interval_s",
        "heartbeat_timeout_s",
        "shutdown_grace_s",
        "max_connections_per_ip",
        "allowed_origins",
        "cert",
        "key",
        "enabled",
        "dir",
        "retention_days",
        "max_total_gb",
        "sweep_interval_s",
        "max_lag_mb",
        "api_keys",
        "api_keys_file",
        "admin_key",
        "max_waiting",
        "update_interval_s",
        "chat_session_s",
        "video_session_s",
        "audio_session_s",
        "context_tokens",
        "min_audio_samples",
        "max_pending_chunks",
        "step_timeout_ms",
        "open_timeout_s",
        "max_reference_audio_s",
        "max_buffered_mb",
        "max_pending_turns",
        "max_waiting_per_ip",
        "max_messages_per_s",
        "max_messages_burst",
        "message_timeout_s",
        "max_fragment_buffer_mb",
        "trusted_proxies",
        "max_total_lag_mb",
        "typical_chat_s",
        "typical_video_s",
        "typical_audio_s",
        "max_session_mb",
        "name",
        "backend",
        "library",
        "count",
        "modes",
        "options",
        "engine",
        "url",
        "prefix",
        "lease_s",
        "attach_timeout_s",
        "standby_links",
        "ca",
        "server_name",
        "advertise",
        "accept_timeout_s",
        "accept",
        "format",
        "realm",
        "digest_algorithm",
        "password_file",
        "secret_file",
    ] {
        assert!(
            text.contains(&format!("{key} "))
                || text.contains(&format!("{key}="))
                || text.contains(&format!(".{key}]")),
            "config.toml does not mention {key}"
        );
    }
}

#[test]
fn a_vllm_omni_entry_is_a_worker_per_slot_serving_duplex_modes_with_its_voice_prompt() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("voice.wav"), omni_actors::audio::encode_wav(&[0.1; 16000], 16000)).unwrap();
    std::fs::write(dir.path().join("big.wav"), vec![0u8; 3 << 20]).unwrap();
    std::fs::write(dir.path().join("not.wav"), b"hello").unwrap();
    let config = dir.path().join("config.toml");
    let entry = |voice: &str| {
        format!(
            "[[workers]]\nbackend = \"vllm-omni\"\nurl = \"http://gpu2:8099\"\ncount = 4\n[workers.options]\nref_audio = \"{voice}\"\n"
        )
    };
    let c = Config::parse(&entry("voice.wav"), &config).unwrap();
    assert_eq!(c.workers.len(), 4, "one worker per session slot");
    assert_eq!(c.workers[3].source, BackendSource::VllmOmni("http://gpu2:8099".into()));
    assert_eq!(c.workers[0].modes, vec![Mode::Video, Mode::Audio], "duplex modes by default");
    let voice = dir.path().join("voice.wav").display().to_string();
    assert!(c.workers[0].options.contains(&("ref_audio".to_string(), voice)), "resolved beside the config");
    let e = Config::parse(&entry("big.wav"), &config).unwrap_err().to_string();
    assert!(e.contains("options.ref_audio") && e.contains("at most 2097152"), "{e}");
    let e = Config::parse(&entry("not.wav"), &config).unwrap_err().to_string();
    assert!(e.contains("is not a WAV file"), "{e}");
}

#[test]
fn a_route_the_app_accepts_needs_a_webhook_that_tells_it_and_openai_webhooks_take_their_secret() {
    let sip = "[sip]\nenabled = true\n[[sip.routes]]\nnumber = \"*\"\naccept = \"webhook\"\n";
    let e = error(&format!("{MINIMAL}{sip}"));
    assert!(e.contains("sip.routes") && e.contains("realtime.call.incoming"), "{e}");
    let hook = |format: &str, secret: &str| {
        format!(
            "[[webhooks]]\nurl = \"http://127.0.0.1:9/hook\"\nevents = [\"realtime.call.incoming\"]\n\
             secret = \"{secret}\"\nformat = \"{format}\"\n"
        )
    };
    let good = "whsec_c2lwLWFwcC13ZWJob29rLXNlY3JldA==";
    let c = parse(&format!("{MINIMAL}{sip}{}", hook("openai", good))).unwrap();
    assert_eq!(c.webhooks[0].format, WebhookFormat::Openai);
    assert_eq!(c.sip.unwrap().routes[0].accept, omni_transports::sip::config::Accept::Webhook);
    let e = error(&format!("{MINIMAL}{}", hook("openai", "0123456789abcdef0123")));
    assert!(e.contains("webhooks[0].secret") && e.contains("whsec_"), "{e}");
    let e = error(&format!("{MINIMAL}{}", hook("openai", "whsec_c2hvcnQ=")));
    assert!(e.contains("16 bytes"), "{e}");
    let e = error(&format!("{MINIMAL}[sip]\nenabled = true\naccept_timeout_s = 0\n"));
    assert!(e.contains("sip.accept_timeout_s"), "{e}");
}

#[test]
fn trunk_credentials_are_read_from_their_files_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("good.pass"), "a-long-trunk-password-0123\n").unwrap();
    std::fs::write(dir.path().join("short.pass"), "short\n").unwrap();
    let config = |users: &str| {
        let text = format!("{MINIMAL}[sip]\nenabled = true\ndigest_algorithm = \"sha-256\"\n{users}");
        Config::parse(&text, &dir.path().join("config.toml"))
    };
    let user = |name: &str, file: &str| format!("[[sip.users]]\nuser = \"{name}\"\npassword_file = \"{file}\"\n");
    let c = config(&user("trunk", "good.pass")).unwrap();
    let sip = c.sip.unwrap();
    assert_eq!(sip.users.0, vec![("trunk".to_string(), "a-long-trunk-password-0123".to_string())]);
    assert_eq!(sip.digest_algorithm, omni_transports::sip::config::DigestAlgorithm::Sha256);
    assert!(!format!("{sip:?}").contains("a-long-trunk-password"), "{sip:?}");
    let e = config(&user("trunk", "short.pass")).unwrap_err().to_string();
    assert!(e.contains("sip.users[0].password_file") && !e.contains("short\n"), "{e}");
    let e = config(&format!("{}{}", user("trunk", "good.pass"), user("trunk", "good.pass"))).unwrap_err().to_string();
    assert!(e.contains("sip.users[1].user") && e.contains("twice"), "{e}");
    let e = config(&user("tr:unk", "good.pass")).unwrap_err().to_string();
    assert!(e.contains("sip.users[0].user"), "{e}");
    let e = config(&user("trunk", "missing.pass")).unwrap_err().to_string();
    assert!(e.contains("missing.pass"), "{e}");
}

#[test]
fn a_webhook_secret_may_come_from_a_file_and_not_from_both() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hook.secret"), "whsec_c2lwLWFwcC13ZWJob29rLXNlY3JldA==\n").unwrap();
    let hook = |secret: &str| {
        format!(
            "{MINIMAL}[[webhooks]]\nurl = \"http://127.0.0.1:9/hook\"\nevents = [\"session.closed\"]\nformat = \"openai\"\n{secret}"
        )
    };
    let c = Config::parse(&hook("secret_file = \"hook.secret\"\n"), &dir.path().join("config.toml")).unwrap();
    assert_eq!(c.webhooks[0].secret, "whsec_c2lwLWFwcC13ZWJob29rLXNlY3JldA==");
    let both = hook("secret_file = \"hook.secret\"\nsecret = \"whsec_c2lwLWFwcC13ZWJob29rLXNlY3JldA==\"\n");
    let e = Config::parse(&both, &dir.path().join("config.toml")).unwrap_err().to_string();
    assert!(e.contains("not both"), "{e}");
    let e = Config::parse(&hook(""), &dir.path().join("config.toml")).unwrap_err().to_string();
    assert!(e.contains("webhooks[0].secret"), "{e}");
}
