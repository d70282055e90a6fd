//! docs/fleet.md's recipes: the Ansible play (ansible-core from PyPI,
//! scripts/deps, the local connection) against a daemon's configuration
//! directory, and consul-template's rendered example and apply script.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::fixtures::*;

fn recipes() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc/examples/fleet")
}

/// One run of the play with these services: whether it succeeded, and
/// all it printed.
fn play(host: &Host, services: &str) -> (bool, String) {
    let venv = PathBuf::from(std::env::var("HOSTMESH_ANSIBLE").unwrap_or("/var/tmp/hostmesh-ansible".into()));
    let playbook = venv.join("bin/ansible-playbook");
    assert!(playbook.exists(), "{} missing: run scripts/deps (it installs ansible-core)", playbook.display());
    let vars = format!(
        "{{\"hostmesh_config_dir\": \"{}\", \"hostmesh_runtime_config_dir\": \"{}\", \
         \"hostmesh_vendor_config_dir\": \"{}\", \"hostmesh_state_dir\": \"{}\", \"hostmesh_bin\": \"{}\", \
         \"hostmesh_services\": {services}}}",
        host.opts.config_dir.display(),
        host.opts.runtime_config_dir.display(),
        host.opts.vendor_config_dir.display(),
        host.opts.state_dir.display(),
        bin()
    );
    let out = Command::new(&playbook)
        .args(["-i", "localhost,", "-c", "local", "-e"])
        .arg(format!("ansible_python_interpreter={}", venv.join("bin/python").display()))
        .args(["-e", &vars])
        .arg(recipes().join("ansible/hostmesh-services.yml"))
        .env("ANSIBLE_NOCOLOR", "1")
        // Ansible's own files in the test's dir, not root's home.
        .env("ANSIBLE_HOME", host.opts.state_dir.join("ansible"))
        .env("ANSIBLE_REMOTE_TEMP", host.opts.state_dir.join("ansible/remote-tmp"))
        .output()
        .expect("run ansible-playbook");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return (false, text + &String::from_utf8_lossy(&out.stderr));
    }
    (true, text)
}

/// A run that succeeds: its recap line, and all it printed.
fn play_ok(host: &Host, services: &str) -> (String, String) {
    let (ok, text) = play(host, services);
    assert!(ok, "{text}");
    (text.lines().find(|l| l.starts_with("localhost") && l.contains("changed=")).unwrap_or_default().to_string(), text)
}

const WEB_DNS: &str = r#"[{"name": "web", "vip": "10.96.0.10", "port": 80, "backends": ["192.168.10.11:8080", "192.168.10.12:8080@2"]},
    {"name": "dns", "vip": "10.96.0.10", "port": 53, "protocol": "udp", "backends": ["192.168.10.11:5353"]}]"#;
const WEB: &str =
    r#"[{"name": "web", "vip": "10.96.0.10", "port": 80, "backends": ["192.168.10.11:8080", "192.168.10.12:8080@2"]}]"#;

#[test]
fn the_ansible_recipe_leaves_a_configuration_the_daemon_applies_and_a_second_run_changes_nothing() {
    let host = Host::new();
    let _d = host.start_ready();
    let (recap, text) = play_ok(&host, WEB_DNS);
    assert!(recap.contains("changed=1 "), "the drop-ins written: {text}");
    // The play shows what hostmesh diff said the daemon would change.
    assert!(text.contains("+ service dns") && text.contains("+ service web"), "{text}");
    applied(&host, 2);
    let (recap, text) = play_ok(&host, WEB_DNS);
    assert!(recap.contains("changed=0 "), "a second run changes nothing: {text}");
    // A service no longer listed: its drop-in goes, and so does the service.
    let (recap, text) = play_ok(&host, WEB);
    assert!(recap.contains("changed=1 ") && text.contains("- service dns"), "{text}");
    assert!(!host.opts.config_dir.join("50-dns.toml").exists());
    applied(&host, 1);
    // A service check rejects: the play stops before anything lands.
    let broken = WEB.replace("\"port\": 80", "\"port\": 0");
    let before = fs::read_to_string(host.opts.config_dir.join("50-web.toml")).unwrap();
    let (ok, text) = play(&host, &broken);
    assert!(!ok && text.contains("port 0 is out of range"), "the play fails at the check: {text}");
    assert_eq!(fs::read_to_string(host.opts.config_dir.join("50-web.toml")).unwrap(), before, "nothing changed");
}

/// Waits until the daemon has applied `n` services and no file is rejected.
fn applied(host: &Host, n: usize) {
    hm_testkit::wait_soon(&format!("{n} services applied"), || {
        let s = host.status();
        s.last_sync.ok && s.counts.services == n && s.files.iter().all(|f| f.errors.is_empty())
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", host.status().files));
}

#[test]
fn consul_template_s_rendered_example_checks_and_the_apply_script_lands_only_what_checks() {
    let host = Host::new();
    let dir = host.opts.config_dir.to_str().unwrap().to_string();
    let example = recipes().join("consul-template/50-consul.toml.example");
    host.write("50-consul.toml", &fs::read_to_string(&example).unwrap());
    let check = host.check(&[]);
    assert_eq!(check.status.code(), Some(0), "{}", String::from_utf8_lossy(&check.stderr));
    assert!(String::from_utf8_lossy(&check.stdout).contains("valid: 2 service(s)"));
    fs::remove_file(host.opts.config_dir.join("50-consul.toml")).unwrap();

    let work = tempfile::tempdir().unwrap();
    let apply = |text: &str| {
        let rendered = work.path().join("50-consul.toml");
        fs::write(&rendered, text).unwrap();
        Command::new(recipes().join("consul-template/hostmesh-apply-dropin"))
            .arg(&rendered)
            .env("HOSTMESH_CONFIG_DIR", &dir)
            .env("HOSTMESH_RUNTIME_CONFIG_DIR", &host.opts.runtime_config_dir)
            .env("HOSTMESH_VENDOR_CONFIG_DIR", &host.opts.vendor_config_dir)
            .env("HOSTMESH", bin())
            .output()
            .unwrap()
    };
    let good = fs::read_to_string(&example).unwrap();
    let out = apply(&good);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(fs::read_to_string(host.opts.config_dir.join("50-consul.toml")).unwrap(), good);
    let out = apply(&good.replace("port = 80", "port = 0"));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("port 0 is out of range"), "the check's error");
    assert_eq!(fs::read_to_string(host.opts.config_dir.join("50-consul.toml")).unwrap(), good, "unchanged");
    let leftovers: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "no temporary file left: {leftovers:?}");
}
