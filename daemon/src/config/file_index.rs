//! One file's claims on what must be unique across the config dir (object
//! names, services' and mesh entries' VIP:port, node ports) and what it
//! takes of the maps, indexed once per parse and kept with it
//! (`FileConfig::derived`), for `merge` to check files against each
//! other from the smaller index of two.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, OnceLock};

use foldhash::quality::RandomState;
use hashbrown::HashTable;

/// The indexes' maps: hashed with foldhash (seeded per process), several
/// times cheaper than SipHash on 100,000 names and addresses.
type HashMap<K, V> = std::collections::HashMap<K, V, RandomState>;

use super::error::Origin;
use super::types::*;
use crate::table_size::service_chunks;

/// (VIP, port, protocol): a service's or a mesh entry's.
pub(super) type Key = (IpAddr, u16, Protocol);
/// (node port, protocol, IPv6): a node port answers on the addresses of
/// its service's family.
pub(super) type PortKey = (u16, Protocol, bool);

/// The kinds of object whose names are unique across the config dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    Service,
    Mesh,
    Peer,
    Member,
}

impl Kind {
    pub(super) const ALL: [Kind; 4] = [Kind::Service, Kind::Mesh, Kind::Peer, Kind::Member];

    pub(super) fn text(self) -> &'static str {
        match self {
            Kind::Service => "service",
            Kind::Mesh => "mesh",
            Kind::Peer => "peer",
            Kind::Member => "member",
        }
    }

    /// The object's name and where it was declared.
    pub(super) fn object(self, f: &FileConfig, i: u32) -> (&str, &Origin) {
        let i = i as usize;
        match self {
            Kind::Service => (&f.services[i].name, &f.services[i].origin),
            Kind::Mesh => (&f.meshes[i].name, &f.meshes[i].origin),
            Kind::Peer => (&f.peers[i].name, &f.peers[i].origin),
            Kind::Member => (&f.members[i].name, &f.members[i].origin),
        }
    }

    pub(super) fn count(self, f: &FileConfig) -> usize {
        match self {
            Kind::Service => f.services.len(),
            Kind::Mesh => f.meshes.len(),
            Kind::Peer => f.peers.len(),
            Kind::Member => f.members.len(),
        }
    }
}

/// What one claim is on: an object's name, a service's or a mesh entry's
/// key, a node port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Claimed {
    Name(Kind),
    Service,
    Mesh,
    NodePort,
}

impl Claimed {
    /// Where the claim of object `i` comes in its file: errors are
    /// reported in this order ([daemon], [gateway], then each service's
    /// name, key and node port, each mesh entry's name and key, peers,
    /// members).
    pub(super) fn order(self, i: u32) -> (u8, u32, u8) {
        match self {
            Claimed::Name(Kind::Service) => (2, i, 0),
            Claimed::Service => (2, i, 1),
            Claimed::NodePort => (2, i, 2),
            Claimed::Name(Kind::Mesh) => (3, i, 0),
            Claimed::Mesh => (3, i, 1),
            Claimed::Name(Kind::Peer) => (4, i, 0),
            Claimed::Name(Kind::Member) => (5, i, 0),
        }
    }
}

/// A claim that repeats one made earlier in the same file.
#[derive(Debug, Clone, Copy)]
pub(super) struct Repeat {
    pub(super) what: Claimed,
    /// The object that repeats it, and the one that made it first.
    pub(super) idx: u32,
    pub(super) first: u32,
}

/// One file's claims, indexed: each name, key and node port with the
/// first object that claims it, the distinct backend addresses, and the
/// map entries it takes. Built once per parse. Names, services' keys and
/// backends are indexed by where they are in the file, not copied: at
/// 100,000 services 3 MB, not 8.
#[derive(Debug)]
pub(super) struct FileIndex {
    pub(super) names: [HashTable<u32>; 4],
    /// Services by key: the first service of each.
    pub(super) services: HashTable<u32>,
    pub(super) meshes: HashMap<Key, u32>,
    pub(super) node_ports: HashMap<PortKey, u32>,
    pub(super) backends: Backends,
    pub(super) repeats: Vec<Repeat>,
    /// Service map entries: one a service, one more for a node port and
    /// for an external VIP.
    pub(super) service_entries: usize,
    /// The HM_MAGLEV chunks its services take at a `[daemon]
    /// maglev_table_size`: the last one asked for.
    chunks: Mutex<Option<(Option<u32>, usize)>>,
}

/// One hash of names for every index of the process: two files' indexes
/// are looked up with each other's names.
fn name_hash(name: &str) -> u64 {
    use std::hash::BuildHasher;
    static STATE: OnceLock<RandomState> = OnceLock::new();
    STATE.get_or_init(RandomState::default).hash_one(name)
}

/// One hash of services' keys and of backend addresses for every index of
/// the process, as `name_hash`.
fn hash_of<T: std::hash::Hash>(v: &T) -> u64 {
    use std::hash::BuildHasher;
    static STATE: OnceLock<RandomState> = OnceLock::new();
    STATE.get_or_init(RandomState::default).hash_one(v)
}

/// A service's key.
fn key_of(s: &Service) -> Key {
    (s.vip, s.port, s.protocol)
}

/// A file's distinct backend addresses, each as where it first is in the
/// file: (service, backend).
#[derive(Debug, Default)]
pub(super) struct Backends(HashTable<(u32, u32)>);

impl Backends {
    fn addr(f: &FileConfig, (i, j): (u32, u32)) -> SocketAddr {
        f.services[i as usize].backends[j as usize].addr
    }

    fn with_capacity(n: usize) -> Self {
        Backends(HashTable::with_capacity(n))
    }

    fn add(&mut self, f: &FileConfig, at: (u32, u32)) {
        let a = Self::addr(f, at);
        if let hashbrown::hash_table::Entry::Vacant(v) =
            self.0.entry(hash_of(&a), |&o| Self::addr(f, o) == a, |&o| hash_of(&Self::addr(f, o)))
        {
            v.insert(at);
        }
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether `f` (this index's file) has backend `a`.
    pub(super) fn contains(&self, f: &FileConfig, a: &SocketAddr) -> bool {
        self.0.find(hash_of(a), |&o| Self::addr(f, o) == *a).is_some()
    }

    /// The addresses, of `f` (this index's file).
    pub(super) fn iter<'a>(&'a self, f: &'a FileConfig) -> impl Iterator<Item = SocketAddr> + 'a {
        self.0.iter().map(move |&o| Self::addr(f, o))
    }
}

/// `f`'s index: built at its first merge, then kept with the parse
/// (`FileConfig::derived`).
pub(super) fn index_of(f: &FileConfig) -> &FileIndex {
    f.derived.get_or_init(|| FileIndex::build(f))
}

impl FileIndex {
    fn build(f: &FileConfig) -> FileIndex {
        let mut ix = FileIndex {
            names: Kind::ALL.map(|k| HashTable::with_capacity(k.count(f))),
            services: HashTable::with_capacity(f.services.len()),
            meshes: HashMap::with_capacity_and_hasher(f.meshes.len(), RandomState::default()),
            node_ports: HashMap::default(),
            backends: Backends::with_capacity(f.services.len()),
            repeats: Vec::new(),
            service_entries: f.services.len()
                + f.services
                    .iter()
                    .map(|s| usize::from(s.node_port.is_some()) + usize::from(s.external))
                    .sum::<usize>(),
            chunks: Mutex::new(None),
        };
        for (i, s) in f.services.iter().enumerate() {
            let i = i as u32;
            ix.add_name(f, Kind::Service, i);
            ix.add_service_key(f, i);
            if let Some(port) = s.node_port {
                add_key(&mut ix.node_ports, &mut ix.repeats, (port, s.protocol, s.vip.is_ipv6()), Claimed::NodePort, i);
            }
            for j in 0..s.backends.len() as u32 {
                ix.backends.add(f, (i, j));
            }
        }
        for (i, m) in f.meshes.iter().enumerate() {
            let i = i as u32;
            ix.add_name(f, Kind::Mesh, i);
            add_key(&mut ix.meshes, &mut ix.repeats, (m.vip, m.port, m.protocol), Claimed::Mesh, i);
        }
        for kind in [Kind::Peer, Kind::Member] {
            for i in 0..kind.count(f) as u32 {
                ix.add_name(f, kind, i);
            }
        }
        ix
    }

    fn add_name(&mut self, f: &FileConfig, kind: Kind, i: u32) {
        let name = kind.object(f, i).0;
        let h = name_hash(name);
        let table = &mut self.names[kind as usize];
        match table.find(h, |&j| kind.object(f, j).0 == name) {
            Some(&first) => self.repeats.push(Repeat { what: Claimed::Name(kind), idx: i, first }),
            None => {
                table.insert_unique(h, i, |&j| name_hash(kind.object(f, j).0));
            }
        }
    }

    fn add_service_key(&mut self, f: &FileConfig, i: u32) {
        let key = key_of(&f.services[i as usize]);
        let table = &mut self.services;
        let at = |j: u32| key_of(&f.services[j as usize]);
        match table.entry(hash_of(&key), |&j| at(j) == key, |&j| hash_of(&at(j))) {
            hashbrown::hash_table::Entry::Occupied(o) => {
                self.repeats.push(Repeat { what: Claimed::Service, idx: i, first: *o.get() })
            }
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert(i);
            }
        }
    }

    /// The first service of `f` (this index's file) with `key`.
    fn find_service(&self, f: &FileConfig, key: &Key) -> Option<u32> {
        self.services.find(hash_of(key), |&j| key_of(&f.services[j as usize]) == *key).copied()
    }

    /// The services' keys both files have: (`f`'s service, `other`'s),
    /// from the smaller index of the two.
    pub(super) fn shared_services<'a>(
        &'a self,
        f: &'a FileConfig,
        theirs: &'a FileIndex,
        other: &'a FileConfig,
    ) -> Box<dyn Iterator<Item = (u32, u32)> + 'a> {
        if self.services.len() <= theirs.services.len() {
            Box::new(
                self.services
                    .iter()
                    .filter_map(move |&i| theirs.find_service(other, &key_of(&f.services[i as usize])).map(|j| (i, j))),
            )
        } else {
            Box::new(
                theirs
                    .services
                    .iter()
                    .filter_map(move |&j| self.find_service(f, &key_of(&other.services[j as usize])).map(|i| (i, j))),
            )
        }
    }

    /// The object of `f` (this index's file) named `name`.
    pub(super) fn find_name(&self, f: &FileConfig, kind: Kind, name: &str) -> Option<u32> {
        self.names[kind as usize].find(name_hash(name), |&j| kind.object(f, j).0 == name).copied()
    }

    /// The HM_MAGLEV chunks the file's services take.
    pub(super) fn chunks(&self, f: &FileConfig, default: Option<u32>) -> usize {
        let mut cached = self.chunks.lock().unwrap_or_else(|e| e.into_inner());
        match *cached {
            Some((d, n)) if d == default => n,
            _ => {
                let n = f.services.iter().map(|s| service_chunks(s.maglev_table_size, default, s.backends.len())).sum();
                *cached = Some((default, n));
                n
            }
        }
    }
}

fn add_key<K: std::hash::Hash + Eq>(
    map: &mut HashMap<K, u32>,
    repeats: &mut Vec<Repeat>,
    key: K,
    what: Claimed,
    i: u32,
) {
    match map.entry(key) {
        std::collections::hash_map::Entry::Occupied(e) => repeats.push(Repeat { what, idx: i, first: *e.get() }),
        std::collections::hash_map::Entry::Vacant(v) => {
            v.insert(i);
        }
    }
}

/// The keys two indexes share: (this one's object, the other's), from
/// the smaller of the two.
pub(super) fn shared<'m, K: std::hash::Hash + Eq>(
    mine: &'m HashMap<K, u32>,
    theirs: &'m HashMap<K, u32>,
) -> Box<dyn Iterator<Item = (&'m K, u32, u32)> + 'm> {
    if mine.len() <= theirs.len() {
        Box::new(mine.iter().filter_map(|(k, &i)| theirs.get(k).map(|&j| (k, i, j))))
    } else {
        Box::new(theirs.iter().filter_map(|(k, &j)| mine.get(k).map(|&i| (k, i, j))))
    }
}
