//! Drop-in precedence as systemd has it: the admin's dir, then the runtime
//! dir, then the vendor's; a name is won by the first dir that has it, a
//! symlink to /dev/null masks it away, and each dir is held to the same
//! trust rules.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use hm_testkit::wait_soon;

use crate::fixtures::*;

fn put(dir: &Path, name: &str, text: &str) {
    fs::create_dir_all(dir).unwrap();
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.join(name);
    fs::write(&path, text).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
}

fn web_at(vip: &str) -> String {
    WEB.replace("10.96.0.10", vip)
}

fn out_text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn a_name_is_won_by_the_first_dir_that_has_it_and_a_dev_null_link_masks_it_away() {
    let host = Host::new();
    let (admin, runtime, vendor) =
        (host.opts.config_dir.clone(), host.opts.runtime_config_dir.clone(), host.opts.vendor_config_dir.clone());
    put(&vendor, "50-web.toml", &web_at("10.96.0.10"));
    put(&vendor, "60-api.toml", API);
    put(&runtime, "50-web.toml", &web_at("10.96.0.11"));

    let check = host.check(&["--offline"]);
    let text = out_text(&check);
    assert_eq!(check.status.code(), Some(0), "{text}");
    let masked_by_runtime =
        format!("{}: masked by {}", vendor.join("50-web.toml").display(), runtime.join("50-web.toml").display());
    assert!(text.contains(&masked_by_runtime), "{text}");
    assert!(text.contains("3 file(s), 0 rejected; valid: 2 service(s)"), "{text}");

    let _d = host.start_ready();
    assert!(host.has_route("10.96.0.11") && host.has_route("10.96.0.20"), "{:?}", host.owned_routes());
    assert!(!host.has_route("10.96.0.10"), "the vendor's web is masked: {:?}", host.owned_routes());
    let (status, _) = host.status_text();
    assert!(
        status.contains(&format!(
            "masked {}: by {}",
            vendor.join("50-web.toml").display(),
            runtime.join("50-web.toml").display()
        )),
        "{status}"
    );
    assert!(status.contains(&format!("in force {}", vendor.join("60-api.toml").display())), "{status}");

    // The admin masks the vendor's api away, and overrides web.
    symlink("/dev/null", admin.join("60-api.toml")).unwrap();
    let masked_away = format!(
        "masked {}: by {} -> /dev/null",
        vendor.join("60-api.toml").display(),
        admin.join("60-api.toml").display()
    );
    // The status file follows the sync's kernel changes: waited for too.
    let mut status = String::new();
    wait_soon("the api route gone and the status saying why", || {
        status = host.status_text().0;
        !host.has_route("10.96.0.20") && status.contains(&masked_away)
    })
    .unwrap_or_else(|e| panic!("{e}:\n{status}"));
    assert!(!status.contains("skipped"), "a masking link is not a skipped entry: {status}");

    host.write("50-web.toml", &web_at("10.96.0.12"));
    wait_soon("the admin's web", || host.has_route("10.96.0.12") && !host.has_route("10.96.0.11")).unwrap();

    // Removed, the admin's file unmasks the runtime one beneath it; a
    // runtime file made while the daemon runs applies too.
    fs::remove_file(admin.join("50-web.toml")).unwrap();
    put(&runtime, "70-other.toml", "[[service]]\nname = \"other\"\nvip = \"10.96.0.30\"\nport = 80\n");
    wait_soon("the runtime web and other", || {
        host.has_route("10.96.0.11") && !host.has_route("10.96.0.12") && host.has_route("10.96.0.30")
    })
    .unwrap();
}

#[test]
fn an_unsafe_file_or_dir_is_refused_in_each_of_the_three_dirs() {
    let host = Host::new();
    let dirs =
        [host.opts.config_dir.clone(), host.opts.runtime_config_dir.clone(), host.opts.vendor_config_dir.clone()];
    for (i, dir) in dirs.iter().enumerate() {
        let name = format!("{}0-svc{i}.toml", i + 1);
        let vip = format!("10.96.1.{}", i + 1);
        put(dir, &name, &format!("[[service]]\nname = \"svc{i}\"\nvip = \"{vip}\"\nport = 80\n"));
        let path = dir.join(&name);

        fs::set_permissions(&path, fs::Permissions::from_mode(0o664)).unwrap();
        let check = host.check(&["--offline"]);
        let text = out_text(&check);
        assert_eq!(check.status.code(), Some(1), "{text}");
        assert!(
            text.contains(&format!("{} is writable by its group (mode 0664); fix: chmod go-w", path.display())),
            "{text}"
        );
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();

        fs::set_permissions(dir, fs::Permissions::from_mode(0o777)).unwrap();
        let check = host.check(&["--offline"]);
        let text = out_text(&check);
        assert_eq!(check.status.code(), Some(1), "{text}");
        assert!(
            text.contains(&format!("not read: {} is writable by group and others (mode 0777)", dir.display())),
            "{text}"
        );
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();

        nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(1000)), None).unwrap();
        let check = host.check(&["--offline"]);
        let text = out_text(&check);
        assert_eq!(check.status.code(), Some(1), "{text}");
        assert!(text.contains(&format!("{} is owned by uid 1000, not root", path.display())), "{text}");
        nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(0)), None).unwrap();
    }
    let check = host.check(&["--offline"]);
    assert_eq!(check.status.code(), Some(0), "{}", out_text(&check));
    assert!(out_text(&check).contains("4 file(s), 0 rejected; valid: 3 service(s)"), "{}", out_text(&check));
}
