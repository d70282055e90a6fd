//! `status.json`: what the daemon has applied, per object, with errors.
//! Written after every sync; read by `hostmesh status`.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use serde::ser::SerializeSeq;
use serde::{Deserialize, Serialize, Serializer};

pub use crate::config::FileState;

pub const STATUS_FILE: &str = "status.json";
pub const STATUS_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub version: u32,
    pub pid: u32,
    /// Unix seconds.
    pub started_at: u64,
    pub updated_at: u64,
    /// The admin's config dir.
    pub config_dir: PathBuf,
    /// Every config dir, first in precedence first (admin, runtime,
    /// vendor).
    #[serde(default)]
    pub config_dirs: Vec<PathBuf>,
    pub bpffs: PathBuf,
    /// Number of syncs so far.
    pub generation: u64,
    pub resync_interval_ms: u64,
    pub ready: bool,
    /// Set when the daemon exits; kernel state stays in place.
    pub stopped: bool,
    pub last_sync: SyncSummary,
    pub counts: Counts,
    pub files: Vec<FileStatus>,
    /// Entries named like drop-ins that were not read, and why.
    #[serde(default)]
    pub skipped: Vec<SkippedEntry>,
    /// Drop-ins hidden by one of the same name in an earlier dir.
    #[serde(default)]
    pub masked: Vec<MaskedEntry>,
    pub objects: Vec<ObjectStatus>,
    pub warnings: Vec<String>,
    /// What the kernel offers, as probed at start.
    #[serde(default)]
    pub kernel: Option<KernelStatus>,
    /// Backends of services with a `health_check`, and draining ones.
    #[serde(default)]
    pub backends: Vec<BackendStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendStatus {
    pub service: String,
    pub address: std::net::SocketAddr,
    pub state: BackendState,
    /// Unix seconds of the last change of state (checked backends).
    pub since: Option<u64>,
    /// Unix seconds of the last check, and whether it passed.
    pub last_check: Option<u64>,
    pub last_passed: Option<bool>,
    /// Why the last failed check failed.
    pub reason: Option<String>,
}

/// Whether a backend takes new connections: `up` does; `down` (failed its
/// checks), `unknown` (not checked yet) and `draining` (weight 0) do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendState {
    Up,
    Down,
    Unknown,
    Draining,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelStatus {
    /// `uname -r`.
    pub release: String,
    /// How TC programs are attached: "tcx" or "netlink".
    pub tc_attach: crate::model::TcAttach,
    /// Features the probes found missing, and what that changes.
    pub missing: Vec<MissingFeature>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingFeature {
    /// "tcx", "set_retval", ... (model::Feature).
    pub feature: crate::model::Feature,
    pub what: String,
    /// The upstream release that brought it.
    pub since: String,
    /// What hostmesh does without it.
    pub without: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncSummary {
    pub ok: bool,
    pub full: bool,
    /// Only the changed services were compiled and planned
    /// (`model::incremental`).
    #[serde(default)]
    pub patched: bool,
    pub at: u64,
    pub duration_ms: u64,
    pub steps: usize,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub services: usize,
    pub meshes: usize,
    pub peers: usize,
    #[serde(default)]
    pub peers_down: usize,
    /// Backends failing their health checks.
    #[serde(default)]
    pub backends_down: usize,
    pub files: usize,
    pub rejected_files: usize,
    pub routes: usize,
    pub links: usize,
    pub map_entries: usize,
    pub programs: usize,
    /// The veth path's conntrack as of the last sweep: entries (two per
    /// flow) of open flows and of closed TCP flows, and the capacity of
    /// each of the two maps; all 0 while they do not exist.
    #[serde(default)]
    pub conntrack_open: usize,
    #[serde(default)]
    pub conntrack_closed: usize,
    #[serde(default)]
    pub conntrack_capacity: u32,
    /// Entries of flows from the network (node ports, external VIPs), two
    /// per flow, in a map of `conntrack_capacity`.
    #[serde(default)]
    pub conntrack_external: usize,
    /// Source ports of `snat_port_range` those flows hold.
    #[serde(default)]
    pub snat_ports: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStatus {
    pub path: PathBuf,
    pub state: FileState,
    pub errors: Vec<ErrorEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedEntry {
    pub path: PathBuf,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaskedEntry {
    pub path: PathBuf,
    /// The entry that won the name.
    pub by: PathBuf,
    /// The winner is a symlink to /dev/null.
    pub by_null: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorEntry {
    pub line: usize,
    pub column: usize,
    pub key: Option<String>,
    pub message: String,
    /// The full one-line form: `file:line:col: message`.
    pub text: String,
}

/// What an object of the status report is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ObjectKind {
    Service,
    Mesh,
    Peer,
    Member,
    Gateway,
    Bpfnat,
    /// The connect-time programs on one cgroup.
    ConnectTime,
}

/// An object's state in the status report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectState {
    /// Every kernel item it needs is in place.
    Applied,
    /// A step it needs failed (its `errors` say which).
    Error,
    /// A mesh entry in place, with no sidecar listening.
    NoSidecar,
    /// A gateway peer answering its probes, or not.
    Up,
    Down,
    /// Not applied, on purpose: an encrypted peer this gateway cannot
    /// carry (its detail says why); its CIDRs are unreachable.
    Refused,
}

/// One table of the names, shared by `Display` and the JSON (serde).
macro_rules! display_as_serde {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match serde_json::to_value(self) {
                    // pad: `hostmesh status` aligns columns with widths.
                    Ok(serde_json::Value::String(s)) => f.pad(&s),
                    _ => write!(f, "{self:?}"),
                }
            }
        }
    )*};
}
display_as_serde!(ObjectKind, ObjectState, BackendState);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectStatus {
    pub kind: ObjectKind,
    pub name: String,
    /// `file:line:col` where it is declared, if it comes from a file.
    pub origin: Option<String>,
    pub state: ObjectState,
    pub detail: String,
    pub errors: Vec<String>,
    /// Unix seconds of the last change of `state`, for states that change
    /// on their own (a peer going down or up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// The gateway that carries the object's traffic now, as its probes
    /// judge (a member's tunnel: its site's gateway; a peer on a gateway:
    /// the peer's), for tools that would otherwise read `detail`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_use: Option<std::net::IpAddr>,
}

impl Status {
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join(STATUS_FILE)
    }

    pub fn write(&self, state_dir: &Path) -> io::Result<()> {
        super::write_atomic_with(&Self::path(state_dir), |w| {
            serde_json::to_writer_pretty(w, self).map_err(io::Error::other)
        })
    }

    /// `write`, with `rows` (each one object's JSON on one line, as
    /// `render_row` renders it) among the objects at index `at`: what
    /// `write` of the status holding those objects there writes, but for
    /// those rows' layout (each on one line). The rows are written as
    /// they are, not parsed again: the status is laid out with a marker
    /// in their place, and written around them.
    pub fn write_with_rows(&self, state_dir: &Path, at: usize, rows: &[&str]) -> io::Result<()> {
        if rows.is_empty() {
            return self.write(state_dir);
        }
        let marker = rows_marker();
        let laid_out = serde_json::to_vec_pretty(&StatusWithRows::new(self, at, &marker)).map_err(io::Error::other)?;
        let quoted = serde_json::to_vec(&marker).map_err(io::Error::other)?;
        let at = laid_out
            .windows(quoted.len())
            .position(|w| w == quoted.as_slice())
            .ok_or_else(|| io::Error::other("the status's layout lost the place of its services' rows"))?;
        super::write_atomic_with(&Self::path(state_dir), |w| {
            w.write_all(&laid_out[..at])?;
            for (i, row) in rows.iter().enumerate() {
                if i > 0 {
                    w.write_all(ROW_SEPARATOR)?;
                }
                w.write_all(row.as_bytes())?;
            }
            w.write_all(&laid_out[at + quoted.len()..])
        })
    }

    pub fn read(state_dir: &Path) -> io::Result<Status> {
        let path = Self::path(state_dir);
        // The status of 100,000 services is about 30 MB.
        let bytes = super::read_state_file(&path, 256 << 20)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))
    }
}

/// One object as `Status::write_with_rows` takes it: its JSON, on one
/// line (100,000 services' rows are one line each in the file).
pub fn render_row(object: &ObjectStatus) -> String {
    serde_json::to_string(object).expect("an object's status is JSON")
}

/// Between two rows: the end of one element of `objects` and the
/// indentation of the next, as the pretty layout has them.
const ROW_SEPARATOR: &[u8] = b",\n    ";

/// The string laid out where the rows go: no other string of a status
/// holds it (this process's random number between two control
/// characters, which names and paths never hold).
fn rows_marker() -> String {
    use std::hash::BuildHasher;
    static NONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let nonce = NONCE.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(std::process::id()));
    format!("\u{1}hostmesh rows {nonce:016x}\u{1}")
}

/// `Status` as `write_with_rows` writes it: every field of `Status`, in
/// its order, with `rows` among the objects. A test keeps the two alike.
#[derive(Serialize)]
struct StatusWithRows<'a> {
    version: u32,
    pid: u32,
    started_at: u64,
    updated_at: u64,
    config_dir: &'a PathBuf,
    config_dirs: &'a [PathBuf],
    bpffs: &'a PathBuf,
    generation: u64,
    resync_interval_ms: u64,
    ready: bool,
    stopped: bool,
    last_sync: &'a SyncSummary,
    counts: &'a Counts,
    files: &'a [FileStatus],
    skipped: &'a [SkippedEntry],
    masked: &'a [MaskedEntry],
    objects: ObjectsWithRows<'a>,
    warnings: &'a [String],
    kernel: &'a Option<KernelStatus>,
    backends: &'a [BackendStatus],
}

impl<'a> StatusWithRows<'a> {
    fn new(s: &'a Status, at: usize, marker: &'a str) -> Self {
        let Status {
            version,
            pid,
            started_at,
            updated_at,
            config_dir,
            config_dirs,
            bpffs,
            generation,
            resync_interval_ms,
            ready,
            stopped,
            last_sync,
            counts,
            files,
            skipped,
            masked,
            objects,
            warnings,
            kernel,
            backends,
        } = s;
        StatusWithRows {
            version: *version,
            pid: *pid,
            started_at: *started_at,
            updated_at: *updated_at,
            config_dir,
            config_dirs,
            bpffs,
            generation: *generation,
            resync_interval_ms: *resync_interval_ms,
            ready: *ready,
            stopped: *stopped,
            last_sync,
            counts,
            files,
            skipped,
            masked,
            objects: ObjectsWithRows { objects, at: at.min(objects.len()), marker },
            warnings,
            kernel,
            backends,
        }
    }
}

/// The objects, with the rows' marker at `at`.
struct ObjectsWithRows<'a> {
    objects: &'a [ObjectStatus],
    at: usize,
    marker: &'a str,
}

impl Serialize for ObjectsWithRows<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.objects.len() + 1))?;
        for o in &self.objects[..self.at] {
            seq.serialize_element(o)?;
        }
        seq.serialize_element(self.marker)?;
        for o in &self.objects[self.at..] {
            seq.serialize_element(o)?;
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str, errors: &[&str], since: Option<u64>) -> ObjectStatus {
        ObjectStatus {
            kind: ObjectKind::Service,
            name: name.into(),
            origin: Some("a.toml:2:8".into()),
            state: if errors.is_empty() { ObjectState::Applied } else { ObjectState::Error },
            detail: "10.96.0.10:80/tcp -> 192.168.1.1:80 (\"connect-time\")\n".into(),
            errors: errors.iter().map(|e| e.to_string()).collect(),
            since,
            in_use: None,
        }
    }

    #[test]
    fn a_status_written_with_rendered_rows_is_the_file_write_gives() {
        let mut status = Status {
            version: STATUS_VERSION,
            pid: 7,
            started_at: 1,
            updated_at: 2,
            config_dir: "/etc/hostmesh".into(),
            config_dirs: vec!["/etc/hostmesh".into()],
            bpffs: "/sys/fs/bpf/hostmesh".into(),
            generation: 3,
            resync_interval_ms: 30_000,
            ready: true,
            stopped: false,
            last_sync: SyncSummary { ok: true, errors: vec!["x: y".into()], ..Default::default() },
            counts: Counts { services: 2, ..Default::default() },
            files: vec![FileStatus {
                path: "/etc/hostmesh/a.toml".into(),
                state: FileState::Applied,
                errors: vec![ErrorEntry { line: 1, column: 2, key: None, message: "m".into(), text: "t".into() }],
            }],
            skipped: vec![SkippedEntry { path: "/etc/hostmesh/b.toml~".into(), reason: "r".into() }],
            masked: vec![],
            objects: vec![object("first", &[], None), object("last", &[], Some(9))],
            warnings: vec!["w".into()],
            kernel: Some(KernelStatus {
                release: "6.1.0".into(),
                tc_attach: crate::model::TcAttach::Netlink,
                missing: vec![MissingFeature {
                    feature: crate::model::Feature::Tcx,
                    what: "tcx".into(),
                    since: "6.6".into(),
                    without: "netlink".into(),
                }],
            }),
            backends: vec![BackendStatus {
                service: "web".into(),
                address: "192.168.1.1:80".parse().unwrap(),
                state: BackendState::Up,
                since: Some(4),
                last_check: Some(5),
                last_passed: Some(true),
                reason: None,
            }],
        };
        let rows = [object("web", &[], None), object("api", &["update HM_SERVICES entry: E2BIG"], None)];
        let rendered: Vec<String> = rows.iter().map(render_row).collect();
        let refs: Vec<&str> = rendered.iter().map(String::as_str).collect();
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        status.write_with_rows(a.path(), 1, &refs).unwrap();
        status.objects.splice(1..1, rows);
        status.write(b.path()).unwrap();
        let read = |d: &tempfile::TempDir| std::fs::read_to_string(Status::path(d.path())).unwrap();
        let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
        assert_eq!(json(&read(&a)), json(&read(&b)));
        assert_eq!(Status::read(a.path()).unwrap(), status);
        // Each row on a line of its own, the rest as `write` lays it out.
        let text = read(&a);
        assert!(text.contains("\n    {\"kind\":\"service\",\"name\":\"web\","), "{text}");
        assert!(text.starts_with("{\n  \"version\": 1,\n  \"pid\": 7,\n"), "{text}");
    }

    #[test]
    fn kinds_and_states_keep_their_names_in_json_and_text() {
        let names = |v: Vec<String>| v.join(" ");
        let kinds = [
            ObjectKind::Service,
            ObjectKind::Mesh,
            ObjectKind::Peer,
            ObjectKind::Member,
            ObjectKind::Gateway,
            ObjectKind::Bpfnat,
            ObjectKind::ConnectTime,
        ];
        assert_eq!(
            names(kinds.iter().map(|k| serde_json::to_string(k).unwrap()).collect()),
            r#""service" "mesh" "peer" "member" "gateway" "bpfnat" "connect-time""#
        );
        let states =
            [ObjectState::Applied, ObjectState::Error, ObjectState::NoSidecar, ObjectState::Up, ObjectState::Down];
        assert_eq!(names(states.iter().map(|s| s.to_string()).collect()), "applied error no_sidecar up down");
        assert_eq!(
            serde_json::to_string(&FileState::RejectedKeepingLastGood).unwrap(),
            r#""rejected_keeping_last_good""#
        );
        // Columns of `hostmesh status` line up: Display honours widths.
        assert_eq!(format!("[{:8}]", ObjectKind::Mesh), "[mesh    ]");
        let back: ObjectState = serde_json::from_str(r#""no_sidecar""#).unwrap();
        assert_eq!(back, ObjectState::NoSidecar);
    }
}
