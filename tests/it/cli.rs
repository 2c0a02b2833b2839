//! The binary's configuration commands, run as a user would.

use std::process::Command;

fn gateway() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_omni-gateway"));
    c.env_remove("OMNI_GATEWAY_CONFIG");
    c
}

#[test]
fn check_config_accepts_the_shipped_file() {
    let out = gateway().args(["check-config", "config.toml"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("config.toml: will listen on 127.0.0.1:8006"), "{stdout}");
    assert!(stdout.contains("sim-0 [builtin; chat, video, audio]: opened omni-reference"), "{stdout}");
    assert!(stdout.contains("config.toml: ok, 1 worker(s)"), "{stdout}");
}

fn check(toml: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, toml).unwrap();
    let out = gateway().arg("check-config").arg(&path).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn check_config_opens_every_backend_with_its_options() {
    for (options, refused) in [
        ("step_msx = 5", "unknown option 'step_msx'"),
        ("reply_steps = \"three\"", "option reply_steps: 'three' is not a non-negative integer"),
    ] {
        let (code, _, stderr) = check(&format!("[[workers]]\n[workers.options]\n{options}\n"));
        assert_eq!(code, Some(1), "{options}: {stderr}");
        assert!(
            stderr.contains("workers[0].options: the backend refuses to open") && stderr.contains(refused),
            "{stderr}"
        );
    }
    // The same through a library in its own process, as the server would open it.
    let (code, _, stderr) = check(&format!(
        "[[workers]]\nbackend = \"library\"\nlibrary = \"{}\"\n[workers.options]\nstep_msx = 5\n",
        env!("OMNI_REFERENCE_LIB")
    ));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("unknown option 'step_msx'"), "{stderr}");
}

#[test]
fn check_config_tells_an_address_it_cannot_listen_on_and_an_unusable_tls_identity() {
    let (code, _, stderr) = check("[server]\nbind = \"10.9.9.9:8006\"\n[[workers]]\n");
    assert_eq!(code, Some(1));
    assert!(stderr.contains("server.bind: cannot listen on 10.9.9.9:8006: address not available"), "{stderr}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secrets.txt"), "not a certificate").unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, "[server.tls]\ncert = \"secrets.txt\"\nkey = \"secrets.txt\"\n[[workers]]\n").unwrap();
    let out = gateway().arg("check-config").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("server.tls.cert:") && stderr.contains("no certificate"), "{stderr}");
}

#[test]
fn a_library_that_does_not_load_is_reported_with_the_loaders_own_words() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notalib.so"), "not a library").unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, "[[workers]]\nbackend = \"library\"\nlibrary = \"notalib.so\"\n").unwrap();
    let out = gateway().arg("check-config").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot load the library: dlopen failed: ") && stderr.contains("file too short"),
        "{stderr}"
    );
}

#[test]
fn a_busy_port_is_one_clear_line_and_no_panic() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, format!("[server]\nbind = \"127.0.0.1:{port}\"\n[[workers]]\n")).unwrap();
    let out = gateway().arg("--config").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains(&format!("omni-gateway: cannot listen on 127.0.0.1:{port}: address already in use")),
        "{stderr}"
    );
}

#[test]
fn a_host_name_that_resolves_can_be_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, "[server]\nbind = \"localhost:0\"\n[[workers]]\n").unwrap();
    let mut child = gateway()
        .arg("--config")
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.starts_with("omni-gateway listening on "), "{line}");
    let addr: std::net::SocketAddr = line.trim().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(addr.ip().is_loopback(), "{addr}");
}

#[test]
fn check_config_names_the_file_and_key_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[[workers]]\nname = \"a\"\n[[workers]]\nbackend = \"library\"\nlibrary = \"missing.so\"\n")
        .unwrap();
    let out = gateway().arg("check-config").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("{}: workers[1].library: no such file", path.display())), "{stderr}");
}

#[test]
fn check_config_loads_libraries_and_reports_a_wrong_abi() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    let ok = format!("[[workers]]\nbackend = \"library\"\nlibrary = \"{}\"\n", env!("OMNI_REFERENCE_LIB"));
    std::fs::write(&path, &ok).unwrap();
    assert!(gateway().arg("check-config").arg(&path).output().unwrap().status.success());

    let bad = format!("[[workers]]\nbackend = \"library\"\nlibrary = \"{}\"\n", env!("OMNI_REFERENCE_LIB_WRONG_ABI"));
    std::fs::write(&path, &bad).unwrap();
    let out = gateway().arg("check-config").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("workers[0].library:") && stderr.contains("ABI version 2"), "{stderr}");
}

#[test]
fn the_config_path_comes_from_the_flag_or_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("env.toml");
    std::fs::write(&path, "[server]\nbind = \"127.0.0.1:9\"\n[[workers]]\n").unwrap();
    let out = gateway().arg("check-config").env("OMNI_GATEWAY_CONFIG", &path).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("127.0.0.1:9"), "OMNI_GATEWAY_CONFIG is read");
    let out = gateway().args(["--config"]).arg(&path).arg("check-config").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("127.0.0.1:9"), "--config is read");
    let out = gateway().args(["--config", "/nonexistent.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "serving with a missing config fails");
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.toml: cannot read"));
}

/// Workers with threads of their own past what `vm.max_map_count` allows are refused by
/// check-config and by the server, with the limit named, instead of aborting while they open;
/// as many unpaced reference workers (no thread of their own) need no mapping and are accepted.
#[test]
fn workers_past_the_hosts_mapping_limit_are_refused_before_anything_opens() {
    let max: usize = std::fs::read_to_string("/proc/sys/vm/max_map_count").unwrap().trim().parse().unwrap();
    let count = max / 8 + 100;
    if count > 100_000 {
        eprintln!("vm.max_map_count is {max} here: a configuration past it would be too large to try");
        return;
    }
    let paced = format!("[[workers]]\nname = \"w\"\ncount = {count}\n[workers.options]\nstep_ms = 1\n");
    let (code, _, stderr) = check(&paced);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&format!("{count} workers with threads of their own")), "{stderr}");
    assert!(stderr.contains(&format!("vm.max_map_count = {max}")), "{stderr}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, format!("[server]\nbind = \"127.0.0.1:0\"\n{paced}")).unwrap();
    // Refused at once: a server that started instead (and opened its workers) is killed after 60 s.
    let mut server = gateway()
        .arg("--config")
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = server.kill();
            panic!("the server started with {count} paced workers instead of refusing them");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut server.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("vm.max_map_count"), "{stderr}");
    let unpaced = format!("[[workers]]\nname = \"w\"\ncount = {count}\n");
    let (code, stdout, stderr) = check(&unpaced);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
}

/// A replica's credential is issued from a node's config, for the replica's name; a replica
/// configured with it loads, named by it.
#[test]
fn a_replica_credential_is_issued_from_a_nodes_config_and_a_replica_loads_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let token = crate::common::NODE_TOKEN;
    let node = dir.path().join("node.toml");
    std::fs::write(&node, format!("[node]\nbind = \"127.0.0.1:7100\"\ntoken = \"{token}\"\n[[workers]]\n")).unwrap();
    let out = gateway().arg("--config").arg(&node).args(["replica-credential", "gw-a"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let issued = String::from_utf8(out.stdout).unwrap();
    // check-config on a node checks the node's bind, not the server's (unused by a node).
    let checked = gateway().arg("check-config").arg(&node).output().unwrap();
    let said = String::from_utf8_lossy(&checked.stdout);
    assert!(said.contains("will listen on 127.0.0.1:7100") && !said.contains(":8006"), "{said}");
    assert!(issued.starts_with("ogr1:gw-a:") && !issued.contains(token), "{issued}");
    let credential = omni_backend_host::link::replica::Credential::parse(&issued).unwrap();
    assert_eq!(credential.password(), omni_backend_host::link::replica::password(token, "gw-a"));
    // A replica holding it (from a file) is gw-a.
    std::fs::write(dir.path().join("replica.credential"), &issued).unwrap();
    let replica =
        "[cluster]\nengine = \"redis\"\nurl = \"redis://127.0.0.1:6399/0\"\ncredential_file = \"replica.credential\"\n";
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, replica).unwrap();
    let config = omni_gateway::config::Config::load(&path).unwrap();
    assert_eq!(config.cluster.unwrap().name, "gw-a");
    // Not from a gateway's config (no token to issue it under), nor for a name that is none.
    let gw = dir.path().join("plain.toml");
    std::fs::write(&gw, "[[workers]]\n").unwrap();
    let out = gateway().arg("--config").arg(&gw).args(["replica-credential", "gw-a"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is issued from a node's config"));
    let out = gateway().arg("--config").arg(&node).args(["replica-credential", "gw a"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("'gw a' is not a replica's name"));
    assert!(out.stdout.is_empty());
}
