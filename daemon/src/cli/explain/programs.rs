//! The programs on an address's path: attached or not, running on a
//! live hook or not, and whether each is this build's (its build mark,
//! probes/build_mark.h, against the marks of the objects this binary
//! carries).

use super::view::{BuildOf, Explanation, PathKind, ProgramView};
use crate::backends::bpf::attached::{AttachedProgram, Mark};
use crate::backends::bpf::objects::build_marks;
use crate::model::Program;

/// The programs that carry a path's traffic.
fn on_path(path: PathKind) -> &'static [Program] {
    match path {
        PathKind::ConnectTime => &Program::CONNECT_TIME,
        PathKind::Veth => &[Program::NatIn, Program::NatOut, Program::Reply, Program::Direct],
        PathKind::Mesh => &[Program::Mesh],
        PathKind::Gateway => &[Program::TunIn, Program::TunOut],
        PathKind::NodePort => &[Program::Reply, Program::Direct],
        PathKind::None => &[],
    }
}

fn build_of(p: &AttachedProgram) -> BuildOf {
    match &p.mark {
        Mark::Build(m) if build_marks(p.attachment.program).contains(m) => BuildOf::This,
        Mark::Build(_) => BuildOf::Other,
        Mark::Unmarked => BuildOf::Unmarked,
        Mark::Unreadable(_) => BuildOf::Unknown,
    }
}

/// "a", "a and b", "a, b and c".
fn list(names: &[String]) -> String {
    match names {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// What is wrong with a path's programs, each as attachments shown.
#[derive(Default)]
struct Findings {
    missing: Vec<String>,
    /// hm_natin not attached: the veth path still works, through hm_natout.
    natin_missing: bool,
    /// hm_sock_release not attached (a kernel without the hook, or a
    /// daemon of an older build): connect-time LB works, and closed
    /// sockets' reverse entries are left to the map's LRU.
    release_missing: bool,
    other: Vec<String>,
    unmarked: Vec<String>,
    unknown: Vec<String>,
    dead: Vec<String>,
    /// Why a mark could not be read, the first time.
    unreadable: Option<String>,
}

/// Adds the path's programs to `e`: a sentence for what is wrong (or that
/// nothing is), a kernel line and a view for each.
pub(super) fn programs(e: &mut Explanation, attached: &[AttachedProgram]) {
    let wanted = on_path(e.path);
    if wanted.is_empty() {
        return;
    }
    let mut f = Findings::default();
    for program in wanted {
        let here: Vec<&AttachedProgram> = attached.iter().filter(|a| a.attachment.program == *program).collect();
        if here.is_empty() && *program == Program::NatIn {
            f.natin_missing = true;
        } else if here.is_empty() && *program == Program::SockRelease {
            f.release_missing = true;
        } else if here.is_empty() {
            f.missing.push(program.name().to_string());
        }
        for a in here {
            let build = build_of(a);
            let shown = a.attachment.to_string();
            match (build, &a.mark) {
                (BuildOf::Other, _) => f.other.push(shown.clone()),
                (BuildOf::Unmarked, _) => f.unmarked.push(shown.clone()),
                (BuildOf::Unknown, Mark::Unreadable(why)) => {
                    f.unknown.push(shown.clone());
                    f.unreadable.get_or_insert_with(|| why.clone());
                }
                _ => {}
            }
            if !a.live {
                f.dead.push(shown.clone());
            }
            e.kernel.push(kernel_line(a, build));
            e.programs.push(ProgramView {
                program: a.attachment.program.name().to_string(),
                hook: shown,
                via: a.via.to_string(),
                id: a.prog_id,
                tag: a.tag.map(hex),
                mark: match a.mark {
                    Mark::Build(m) => Some(format!("{m:016x}")),
                    _ => None,
                },
                build,
                live: a.live,
            });
        }
    }
    // With the path's other programs missing too, it is one of them.
    if f.release_missing && !f.missing.is_empty() {
        f.release_missing = false;
        f.missing.push(Program::SockRelease.name().to_string());
    }
    e.sentences.extend(f.sentences(e.path, wanted.len()));
}

impl Findings {
    fn sentences(&self, path: PathKind, wanted: usize) -> Vec<String> {
        let is = |v: &[String]| if v.len() == 1 { "is" } else { "are" };
        let mut out = Vec::new();
        if !self.missing.is_empty() {
            out.push(format!(
                "{} {} not attached: {}",
                list(&self.missing),
                is(&self.missing),
                if path == PathKind::Mesh {
                    "hostmesh redirects with its nftables fallback where sk_lookup is missing \
                     (`hostmesh status` says which)."
                } else {
                    "this path does not work until the daemon attaches it (`hostmesh status` says why)."
                }
            ));
        }
        if self.natin_missing {
            out.push(format!(
                "{} is not attached: packets to this VIP cross the veth, and {} translates them there (it works, at \
                 the cost of a second device hop; `hostmesh status` says why).",
                Program::NatIn.name(),
                Program::NatOut.name()
            ));
        }
        if self.release_missing {
            out.push(format!(
                "{} is not attached: connect-time LB works, but a closed socket's entry in the reverse-socket map \
                 stays until the map's LRU pushes it out (`hostmesh status` says why).",
                Program::SockRelease.name()
            ));
        }
        if !self.dead.is_empty() {
            out.push(format!("{} {} pinned but the hook is gone: it runs nowhere.", list(&self.dead), is(&self.dead)));
        }
        if !self.other.is_empty() {
            out.push(format!(
                "{} {} another build's program (its build mark differs from this binary's): \
                 `systemctl restart hostmesh` replaces it with this build's.",
                list(&self.other),
                is(&self.other)
            ));
        }
        if !self.unmarked.is_empty() {
            out.push(format!(
                "{} {} a program without a build mark, loaded by a hostmesh from before marks: a restart replaces it.",
                list(&self.unmarked),
                is(&self.unmarked)
            ));
        }
        if !self.unknown.is_empty() {
            out.push(format!(
                "Whether {} {} this build's cannot be read ({}): reading programs by id needs CAP_SYS_ADMIN.",
                list(&self.unknown),
                is(&self.unknown),
                self.unreadable.as_deref().unwrap_or("")
            ));
        }
        if out.is_empty() {
            out.push(if wanted == 1 {
                "The program on this path is attached and is this build's.".to_string()
            } else {
                format!("The {wanted} programs on this path are attached and are this build's.")
            });
        }
        out
    }
}

fn hex(tag: [u8; 8]) -> String {
    tag.iter().map(|b| format!("{b:02x}")).collect()
}

fn kernel_line(a: &AttachedProgram, build: BuildOf) -> String {
    format!(
        "program {} (id {}{}, by {}): {}{}",
        a.attachment,
        a.prog_id,
        a.tag.map(|t| format!(", tag {}", hex(t))).unwrap_or_default(),
        a.via,
        match build {
            BuildOf::This => "this build's",
            BuildOf::Other => "another build's",
            BuildOf::Unmarked => "no build mark",
            BuildOf::Unknown => "build unknown",
        },
        if a.live { "" } else { " (hook gone)" }
    )
}
