use std::os::unix::fs::PermissionsExt;

use super::*;

/// A key as `wg genkey` writes it (this one is only ever a test's).
const KEY: &str = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";

fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

fn dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

#[test]
fn public_keys_are_44_characters_of_base64_for_32_bytes_and_print_as_written() {
    let k = PublicKey::parse(KEY).expect("a key");
    assert_eq!(k.to_string(), KEY);
    assert_eq!(format!("{k:?}"), format!("PublicKey({KEY})"));
    assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{KEY}\""));
    for bad in [
        "",
        "abc",
        &KEY[..43],
        &format!("{KEY}="),
        "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!=",
        " yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk",
    ] {
        assert_eq!(PublicKey::parse(bad), None, "{bad:?}");
    }
}

#[test]
fn a_key_source_is_an_absolute_path_or_a_credential_name() {
    assert_eq!(KeySource::parse("/etc/hostmesh/keys/a.key"), Ok(KeySource::File("/etc/hostmesh/keys/a.key".into())));
    assert_eq!(KeySource::parse("credential:site-a.key"), Ok(KeySource::Credential("site-a.key".into())));
    for bad in ["keys/a.key", "credential:", "credential:../x", "credential:a/b", "credential:.."] {
        assert!(KeySource::parse(bad).is_err(), "{bad}");
    }
    let src = KeySource::Credential("site-a.key".into());
    assert_eq!(src.to_string(), "credential:site-a.key");
    assert_eq!(serde_json::to_string(&src).unwrap(), "\"credential:site-a.key\"");
}

#[test]
fn a_safe_key_file_is_read_and_its_key_never_prints() {
    let d = dir();
    let p = write(d.path(), "a.key", &format!("{KEY}\n"), 0o600);
    let key = read_private_key(&KeySource::File(p), None).expect("a safe key");
    assert_eq!(base64::engine::general_purpose::STANDARD.encode(key.expose()), KEY);
    assert_eq!(format!("{key:?}"), "PrivateKey(redacted)");
    let p = write(d.path(), "b.key", KEY, 0o400);
    assert!(read_private_key(&KeySource::File(p), None).is_ok(), "read-only for root, no newline");
}

#[test]
fn a_key_file_others_may_read_or_write_or_that_is_not_root_s_is_refused_with_the_fix() {
    let d = dir();
    let p = write(d.path(), "a.key", KEY, 0o644);
    let e = read_private_key(&KeySource::File(p.clone()), None).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "private key {}: readable by group and others (mode 0644); fix: chmod 0600 {}",
            p.display(),
            p.display()
        )
    );
    let p = write(d.path(), "b.key", KEY, 0o640);
    assert!(matches!(read_private_key(&KeySource::File(p), None), Err(KeyError::Readable { who: "its group", .. })));
    let p = write(d.path(), "c.key", KEY, 0o602);
    let e = read_private_key(&KeySource::File(p), None).unwrap_err();
    assert!(e.to_string().contains("fix: chmod go-w"), "{e}");
    let p = write(d.path(), "d.key", KEY, 0o600);
    nix::unistd::chown(&p, Some(nix::unistd::Uid::from_raw(1000)), None).unwrap();
    let e = read_private_key(&KeySource::File(p), None).unwrap_err();
    assert!(e.to_string().contains("owned by uid 1000, not root; fix: chown root"), "{e}");
    assert!(!e.to_string().contains(KEY) && !format!("{e:?}").contains(KEY), "{e}");
}

#[test]
fn a_key_in_a_dir_others_may_write_a_symlink_a_dir_or_no_key_is_refused() {
    let d = dir();
    let p = write(d.path(), "a.key", KEY, 0o600);
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = read_private_key(&KeySource::File(p.clone()), None).unwrap_err();
    assert!(matches!(e, KeyError::Unsafe(crate::trust::Unsafe::Writable { .. })), "{e}");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = d.path().join("link.key");
    std::os::unix::fs::symlink(&p, &link).unwrap();
    assert!(matches!(read_private_key(&KeySource::File(link), None), Err(KeyError::Unreadable { .. })));
    let sub = d.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    assert!(matches!(read_private_key(&KeySource::File(sub), None), Err(KeyError::NotAFile { .. })));
    let missing = d.path().join("missing.key");
    let e = read_private_key(&KeySource::File(missing.clone()), None).unwrap_err();
    assert!(e.to_string().starts_with(&format!("private key {}: ", missing.display())), "{e}");
    let secret_text = "this is not a key but it is private";
    for text in [secret_text, &KEY[..40], &"A".repeat(MAX_FILE + 10)] {
        let p = write(d.path(), "bad.key", text, 0o600);
        let e = read_private_key(&KeySource::File(p), None).unwrap_err();
        assert!(matches!(e, KeyError::NotAKey { .. }), "{e}");
        assert!(!e.to_string().contains(secret_text) && !format!("{e:?}").contains(secret_text), "{e}");
    }
}

#[test]
fn a_credential_is_read_from_the_credentials_directory_and_needs_it() {
    let d = dir();
    write(d.path(), "site-a.key", KEY, 0o400);
    let src = KeySource::Credential("site-a.key".into());
    assert!(read_private_key(&src, Some(d.path())).is_ok());
    let e = read_private_key(&src, None).unwrap_err();
    assert!(e.to_string().contains("LoadCredential=site-a.key:"), "{e}");
}

#[test]
fn the_public_key_is_the_private_key_s_as_rfc_7748_computes_it() {
    // RFC 7748, 6.1: Alice's private key and public key.
    let d = dir();
    let p = write(d.path(), "alice.key", "dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo=\n", 0o600);
    let key = read_private_key(&KeySource::File(p), None).unwrap();
    assert_eq!(key.public_key().to_string(), "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=");
}
