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
    assert!(stdout.contains("config.toml: ok, listening on 127.0.0.1:8006, 1 worker(s)"), "{stdout}");
    assert!(stdout.contains("sim-0 [builtin; chat, video, audio]"), "{stdout}");
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
