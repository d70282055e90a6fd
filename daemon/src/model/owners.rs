//! Which config objects an item of kernel state exists for (`service/web`,
//! `bpfnat`), compactly: at 100,000 services the desired state holds over
//! half a million items, nearly all with exactly one owner, and every item
//! of one service has the same one. A `BTreeSet<String>` per item cost a
//! tree node and a string each (~310 bytes); here one owner is held inline
//! and the name is shared (`Owner`, reference-counted) by all the items of
//! its object, so an item's owners cost 24 bytes and no allocation.

use std::fmt;
use std::sync::Arc;

use serde::{Serialize, Serializer};

/// One config object's name, shared by every item it owns.
pub(crate) type Owner = Arc<str>;

/// What `want` takes as an owner: a shared `Owner` (or a reference to one)
/// costs a count; a string is copied into a new `Owner`.
pub(crate) trait IntoOwner {
    fn into_owner(self) -> Owner;
}

impl IntoOwner for Owner {
    fn into_owner(self) -> Owner {
        self
    }
}

impl IntoOwner for &Owner {
    fn into_owner(self) -> Owner {
        self.clone()
    }
}

impl IntoOwner for &str {
    fn into_owner(self) -> Owner {
        self.into()
    }
}

impl IntoOwner for &String {
    fn into_owner(self) -> Owner {
        self.as_str().into()
    }
}

/// The config objects kernel state exists for: the one table of their
/// names (`service/web`), which compile tags items with and the status
/// report looks errors up by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Object<'a> {
    /// A `[[service]]`: its map entries and routes.
    Service(&'a str),
    /// What all services share: HM_CONFIG and the connect-time programs.
    Services,
    /// The bpfnat veth path: its links, sysctls, neighbours and programs.
    Bpfnat,
    /// A `[[mesh]]` entry.
    Mesh(&'a str),
    /// What all mesh entries share: the sk_lookup program.
    Meshes,
    /// `[gateway]`: the tunnel and its programs.
    Gateway,
    /// A gateway's `[[peer]]`.
    Peer(&'a str),
    /// A member of this site, as the gateway sees it.
    Member(&'a str),
}

impl fmt::Display for Object<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Object::Service(name) => write!(f, "service/{name}"),
            Object::Services => f.write_str("services"),
            Object::Bpfnat => f.write_str("bpfnat"),
            Object::Mesh(name) => write!(f, "mesh/{name}"),
            Object::Meshes => f.write_str("mesh"),
            Object::Gateway => f.write_str("gateway"),
            Object::Peer(name) => write!(f, "peer/{name}"),
            Object::Member(name) => write!(f, "member/{name}"),
        }
    }
}

impl Object<'_> {
    /// Every kind of object, as `kind_of` names them.
    pub(crate) const KINDS: [&'static str; 7] = ["service", "services", "bpfnat", "mesh", "gateway", "peer", "member"];

    /// The kind of object an owner names (`service/web` -> "service"), by
    /// the names of the table above; "other" for a name it does not make.
    pub(crate) fn kind_of(owner: &str) -> &'static str {
        let head = owner.split_once('/').map_or(owner, |(kind, _)| kind);
        Self::KINDS.into_iter().find(|k| *k == head).unwrap_or("other")
    }
}

impl IntoOwner for Object<'_> {
    fn into_owner(self) -> Owner {
        self.to_string().into()
    }
}

/// A set of owners, sorted, without repeats.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Owners(Set);

#[derive(Clone, Default, PartialEq, Eq, Hash)]
enum Set {
    #[default]
    Empty,
    One(Owner),
    /// Two or more, sorted.
    Many(Vec<Owner>),
}

impl Owners {
    pub(crate) const fn new() -> Self {
        Owners(Set::Empty)
    }

    pub(crate) fn is_empty(&self) -> bool {
        matches!(self.0, Set::Empty)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn as_slice(&self) -> &[Owner] {
        match &self.0 {
            Set::Empty => &[],
            Set::One(o) => std::slice::from_ref(o),
            Set::Many(v) => v,
        }
    }

    /// The owners' names, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        self.as_slice().iter().map(|o| &**o)
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.as_slice().binary_search_by(|o| (**o).cmp(name)).is_ok()
    }

    /// Adds `owner`; false if it was there already.
    pub(crate) fn insert(&mut self, owner: Owner) -> bool {
        match &mut self.0 {
            Set::Empty => self.0 = Set::One(owner),
            Set::One(first) => match (**first).cmp(&*owner) {
                std::cmp::Ordering::Equal => return false,
                std::cmp::Ordering::Less => self.0 = Set::Many(vec![first.clone(), owner]),
                std::cmp::Ordering::Greater => self.0 = Set::Many(vec![owner, first.clone()]),
            },
            Set::Many(v) => match v.binary_search_by(|o| (**o).cmp(&*owner)) {
                Ok(_) => return false,
                Err(at) => v.insert(at, owner),
            },
        }
        true
    }

    /// Takes `name` out; false if it was not there.
    pub(crate) fn remove(&mut self, name: &str) -> bool {
        match &mut self.0 {
            Set::Empty => false,
            Set::One(o) if &**o == name => {
                self.0 = Set::Empty;
                true
            }
            Set::One(_) => false,
            Set::Many(v) => match v.binary_search_by(|o| (**o).cmp(name)) {
                Ok(at) => {
                    v.remove(at);
                    if v.len() == 1 {
                        self.0 = Set::One(v.pop().expect("one left"));
                    }
                    true
                }
                Err(_) => false,
            },
        }
    }

    /// Adds every owner of `other`.
    pub(crate) fn extend_from(&mut self, other: &Owners) {
        for o in other.as_slice() {
            self.insert(o.clone());
        }
    }
}

impl<S: Into<Owner>> FromIterator<S> for Owners {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut set = Owners::new();
        for o in iter {
            set.insert(o.into());
        }
        set
    }
}

impl<const N: usize> From<[&str; N]> for Owners {
    fn from(names: [&str; N]) -> Self {
        names.into_iter().collect()
    }
}

impl fmt::Debug for Owners {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl Serialize for Owners {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_owner_names_its_kind() {
        let objects = [
            Object::Service("web"),
            Object::Services,
            Object::Bpfnat,
            Object::Mesh("m"),
            Object::Meshes,
            Object::Gateway,
            Object::Peer("b"),
            Object::Member("w"),
        ];
        let kinds: Vec<&str> = objects.iter().map(|o| Object::kind_of(&o.to_string())).collect();
        assert_eq!(kinds, ["service", "services", "bpfnat", "mesh", "mesh", "gateway", "peer", "member"]);
        assert_eq!(Object::kind_of("nonsense/x"), "other");
    }

    fn names(o: &Owners) -> Vec<&str> {
        o.iter().collect()
    }

    #[test]
    fn insert_keeps_names_sorted_and_unique() {
        let mut o = Owners::new();
        assert!(o.insert("service/web".into()));
        assert!(!o.insert("service/web".into()));
        assert!(o.insert("bpfnat".into()));
        assert!(o.insert("service/dns".into()));
        assert!(!o.insert("bpfnat".into()));
        assert_eq!(names(&o), ["bpfnat", "service/dns", "service/web"]);
        assert!(o.contains("service/dns") && !o.contains("service/api"));
        assert_eq!(o.len(), 3);
    }

    #[test]
    fn remove_down_to_empty() {
        let mut o: Owners = ["b", "a"].into_iter().collect();
        assert!(!o.remove("c"));
        assert!(o.remove("a"));
        assert_eq!(names(&o), ["b"]);
        assert_eq!(o, ["b"].into_iter().collect());
        assert!(o.remove("b"));
        assert!(o.is_empty() && !o.remove("b"));
        assert_eq!(o, Owners::new());
    }

    #[test]
    fn one_owner_is_held_inline_and_shared() {
        // The point of the type: an item's owners are no bigger than a Vec
        // and the name is not copied per item.
        assert!(std::mem::size_of::<Owners>() <= 24);
        let owner: Owner = "service/web".into();
        let mut a = Owners::new();
        let mut b = Owners::new();
        a.insert(owner.clone());
        b.insert(owner.clone());
        assert_eq!(Arc::strong_count(&owner), 3);
    }

    #[test]
    fn serializes_as_a_list_of_names() {
        let o: Owners = ["service/web", "bpfnat"].into_iter().collect();
        assert_eq!(serde_json::to_string(&o).unwrap(), r#"["bpfnat","service/web"]"#);
    }
}
