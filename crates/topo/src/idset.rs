//! Sets of kernel ids (cpus, nodes) in the Linux list syntax: `0-3,8,10-11`.
//!
//! The kernel prints cpu and node masks this way in `/sys` (`cpulist`, `cpuset.cpus`) and
//! numactl/taskset accept it; loci reads and prints the same syntax everywhere.
//! Extensions when a universe is known ([`IdSet::parse_in`]): `all` and a leading `!`
//! (everything in the universe except the list).

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Largest id accepted by the parser; the kernel's NR_CPUS tops out at 8192.
pub const MAX_ID: u32 = 65_535;

/// Error from parsing a list. Names the offending token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListError {
    #[error("bad token `{token}` in list `{list}`: {why} (expected a list like `0-3,8,10-11`)")]
    BadToken {
        list: String,
        token: String,
        why: String,
    },
    #[error("`{token}` in list `{list}` needs a known set of valid ids (use it where the machine is known)")]
    NeedsUniverse { list: String, token: String },
}

/// An ordered set of ids. `CpuSet` and `NodeSet` wrap it so the two cannot be mixed up.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdSet(BTreeSet<u32>);

impl IdSet {
    pub fn new() -> Self {
        Self(BTreeSet::new())
    }
    pub fn single(id: u32) -> Self {
        Self(BTreeSet::from([id]))
    }
    pub fn insert(&mut self, id: u32) -> bool {
        self.0.insert(id)
    }
    pub fn remove(&mut self, id: u32) -> bool {
        self.0.remove(&id)
    }
    pub fn contains(&self, id: u32) -> bool {
        self.0.contains(&id)
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = u32> + ExactSizeIterator + '_ {
        self.0.iter().copied()
    }
    pub fn first(&self) -> Option<u32> {
        self.0.first().copied()
    }
    pub fn last(&self) -> Option<u32> {
        self.0.last().copied()
    }
    pub fn union(&self, o: &Self) -> Self {
        Self(self.0.union(&o.0).copied().collect())
    }
    pub fn intersection(&self, o: &Self) -> Self {
        Self(self.0.intersection(&o.0).copied().collect())
    }
    pub fn difference(&self, o: &Self) -> Self {
        Self(self.0.difference(&o.0).copied().collect())
    }
    pub fn is_subset(&self, o: &Self) -> bool {
        self.0.is_subset(&o.0)
    }

    /// Parses the plain list syntax (`0-3,8`, empty string = empty set). Whitespace around tokens
    /// and a trailing newline (as in sysfs files) are accepted. `all` and `!` are refused here;
    /// use [`IdSet::parse_in`].
    pub fn parse(s: &str) -> Result<Self, ListError> {
        Self::parse_impl(s, None)
    }

    /// Parses a list with `all` (= `universe`) and `!LIST` (= `universe` minus the list).
    pub fn parse_in(s: &str, universe: &IdSet) -> Result<Self, ListError> {
        Self::parse_impl(s, Some(universe))
    }

    fn parse_impl(s: &str, universe: Option<&IdSet>) -> Result<Self, ListError> {
        let list = s.trim();
        let bad = |token: &str, why: &str| ListError::BadToken {
            list: list.to_string(),
            token: token.to_string(),
            why: why.to_string(),
        };
        let needs = |token: &str| ListError::NeedsUniverse {
            list: list.to_string(),
            token: token.to_string(),
        };
        if list == "all" {
            return universe.cloned().ok_or_else(|| needs("all"));
        }
        if let Some(rest) = list.strip_prefix('!') {
            let u = universe.ok_or_else(|| needs("!"))?;
            let inner = Self::parse_impl(rest, Some(u))?;
            return Ok(u.difference(&inner));
        }
        let mut out = BTreeSet::new();
        if list.is_empty() {
            return Ok(Self(out));
        }
        // Returns the reason on failure; callers attach the whole token.
        let num = |t: &str| -> Result<u32, String> {
            let t = t.trim();
            if t.is_empty() {
                return Err("missing number".into());
            }
            let v: u64 = t
                .parse()
                .map_err(|_| format!("`{t}` is not a non-negative integer"))?;
            if v > MAX_ID as u64 {
                return Err(format!("{v} is larger than {MAX_ID}"));
            }
            Ok(v as u32)
        };
        for raw in list.split(',') {
            let token = raw.trim();
            if token.is_empty() {
                return Err(bad(raw, "empty item (doubled or trailing comma?)"));
            }
            // Kernel stride form `a-b:step` is accepted (used by cgroup cpuset and `isolcpus`).
            let (range, stride) = match token.split_once(':') {
                Some((r, st)) => {
                    let st = num(st).map_err(|w| bad(token, &format!("stride after `:`: {w}")))?;
                    if st == 0 {
                        return Err(bad(token, "stride must be at least 1"));
                    }
                    (r, st)
                }
                None => (token, 1),
            };
            match range.split_once('-') {
                Some((a, b)) => {
                    let a = num(a).map_err(|w| bad(token, &format!("range start: {w}")))?;
                    let b = num(b).map_err(|w| bad(token, &format!("range end: {w}")))?;
                    if a > b {
                        return Err(bad(token, "range start is greater than its end"));
                    }
                    out.extend((a..=b).step_by(stride as usize));
                }
                None => {
                    if stride != 1 {
                        return Err(bad(token, "a stride needs a range (`a-b:step`)"));
                    }
                    out.insert(num(range).map_err(|w| bad(token, &w))?);
                }
            }
        }
        Ok(Self(out))
    }

    /// Parses a kernel hex mask as in `/proc/self/status` `Cpus_allowed:` (`ff,00000003`): 32-bit
    /// words, most significant first. A word wider than 32 bits and a bit above [`MAX_ID`] are
    /// errors, as [`IdSet::parse`] refuses such ids (before, the high bits of a wide word were
    /// dropped silently, and long masks gave ids that did not print and parse back; the fuzz
    /// target `idset` checks both).
    pub fn parse_mask(s: &str) -> Result<Self, ListError> {
        let list = s.trim();
        let bad = |token: &str, why: String| ListError::BadToken {
            list: list.to_string(),
            token: token.to_string(),
            why,
        };
        let mut out = BTreeSet::new();
        let words: Vec<&str> = list.split(',').collect();
        for (i, w) in words.iter().rev().enumerate() {
            let v = u32::from_str_radix(w.trim(), 16)
                .map_err(|_| bad(w, "not a 32-bit hex word (at most 8 hex digits)".into()))?;
            for bit in 0..32u32 {
                if v >> bit & 1 == 1 {
                    // u64: the word index times 32 may not fit a u32 for a huge input.
                    let id = i as u64 * 32 + bit as u64;
                    if id > MAX_ID as u64 {
                        return Err(bad(
                            w,
                            format!("sets bit {id}, beyond the largest id {MAX_ID}"),
                        ));
                    }
                    out.insert(id as u32);
                }
            }
        }
        Ok(Self(out))
    }
}

impl fmt::Display for IdSet {
    /// Prints the canonical list syntax: ascending, ranges of 2+ consecutive ids as `a-b`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.0.iter().copied().peekable();
        while let Some(start) = it.next() {
            let mut end = start;
            while it.peek() == Some(&(end + 1)) {
                end = it.next().unwrap();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if end == start {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for IdSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{self}]")
    }
}

impl FromIterator<u32> for IdSet {
    fn from_iter<T: IntoIterator<Item = u32>>(iter: T) -> Self {
        Self(iter.into_iter().collect())
    }
}

macro_rules! typed_set {
    ($name:ident, $what:literal) => {
        #[doc = concat!("A set of ", $what, " ids in the Linux list syntax.")]
        #[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub IdSet);

        impl $name {
            pub fn new() -> Self {
                Self(IdSet::new())
            }
            pub fn single(id: u32) -> Self {
                Self(IdSet::single(id))
            }
            pub fn parse(s: &str) -> Result<Self, ListError> {
                IdSet::parse(s).map(Self)
            }
            pub fn parse_in(s: &str, universe: &$name) -> Result<Self, ListError> {
                IdSet::parse_in(s, &universe.0).map(Self)
            }
            pub fn parse_mask(s: &str) -> Result<Self, ListError> {
                IdSet::parse_mask(s).map(Self)
            }
            pub fn insert(&mut self, id: u32) -> bool {
                self.0.insert(id)
            }
            pub fn remove(&mut self, id: u32) -> bool {
                self.0.remove(id)
            }
            pub fn contains(&self, id: u32) -> bool {
                self.0.contains(id)
            }
            pub fn len(&self) -> usize {
                self.0.len()
            }
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }
            pub fn iter(&self) -> impl DoubleEndedIterator<Item = u32> + ExactSizeIterator + '_ {
                self.0.iter()
            }
            pub fn first(&self) -> Option<u32> {
                self.0.first()
            }
            pub fn last(&self) -> Option<u32> {
                self.0.last()
            }
            pub fn union(&self, o: &Self) -> Self {
                Self(self.0.union(&o.0))
            }
            pub fn intersection(&self, o: &Self) -> Self {
                Self(self.0.intersection(&o.0))
            }
            pub fn difference(&self, o: &Self) -> Self {
                Self(self.0.difference(&o.0))
            }
            pub fn is_subset(&self, o: &Self) -> bool {
                self.0.is_subset(&o.0)
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}[{}]", stringify!($name), self.0)
            }
        }
        impl FromStr for $name {
            type Err = ListError;
            fn from_str(s: &str) -> Result<Self, ListError> {
                Self::parse(s)
            }
        }
        impl FromIterator<u32> for $name {
            fn from_iter<T: IntoIterator<Item = u32>>(iter: T) -> Self {
                Self(iter.into_iter().collect())
            }
        }
        /// Serialized as the list string (`"0-3,8"`), as in loci's JSON schemas.
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

typed_set!(CpuSet, "cpu");
typed_set!(NodeSet, "NUMA node");

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_prints_lists() {
        let s = IdSet::parse("0-3,8,10-11\n").unwrap();
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(s.to_string(), "0-3,8,10-11");
        assert_eq!(IdSet::parse("").unwrap().len(), 0);
        assert_eq!(IdSet::parse(" 5 ").unwrap().to_string(), "5");
        assert_eq!(IdSet::parse("0-7:2").unwrap().to_string(), "0,2,4,6");
        assert_eq!(IdSet::parse("3,1,2").unwrap().to_string(), "1-3");
    }

    #[test]
    fn errors_name_the_bad_token() {
        let e = IdSet::parse("0-3,x,5").unwrap_err().to_string();
        assert!(e.contains("`x`"), "{e}");
        let e = IdSet::parse("4-2").unwrap_err().to_string();
        assert!(e.contains("`4-2`") && e.contains("greater"), "{e}");
        let e = IdSet::parse("1,,2").unwrap_err().to_string();
        assert!(e.contains("empty item"), "{e}");
        let e = IdSet::parse("-1").unwrap_err().to_string();
        assert!(e.contains("`-1`"), "{e}");
        let e = IdSet::parse("99999999").unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
        assert!(matches!(
            IdSet::parse("all"),
            Err(ListError::NeedsUniverse { .. })
        ));
        assert!(matches!(
            IdSet::parse("!1"),
            Err(ListError::NeedsUniverse { .. })
        ));
    }

    #[test]
    fn all_and_inversion() {
        let u = IdSet::parse("0-7").unwrap();
        assert_eq!(IdSet::parse_in("all", &u).unwrap(), u);
        assert_eq!(IdSet::parse_in("!0-1,7", &u).unwrap().to_string(), "2-6");
        assert_eq!(IdSet::parse_in("3", &u).unwrap().to_string(), "3");
    }

    #[test]
    fn hex_masks() {
        assert_eq!(IdSet::parse_mask("3").unwrap().to_string(), "0-1");
        assert_eq!(
            IdSet::parse_mask("00000001,00000000,80000000")
                .unwrap()
                .to_string(),
            "31,64"
        );
        assert!(IdSet::parse_mask("zz").is_err());
        // Leading zero words are fine however many there are; a set bit above MAX_ID is not.
        let zeros = vec!["00000000"; 5000].join(",");
        assert_eq!(
            IdSet::parse_mask(&format!("{zeros},1"))
                .unwrap()
                .to_string(),
            "0"
        );
        let e = IdSet::parse_mask(&format!("1,{zeros}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("beyond the largest id"), "{e}");
        // Bit 65535 (word 2047, bit 31) is the largest id; bit 65536 is one too many.
        let top = |w: &str, below: usize| format!("{w},{}", vec!["0"; below].join(","));
        assert_eq!(
            IdSet::parse_mask(&top("80000000", 2047))
                .unwrap()
                .to_string(),
            "65535"
        );
        assert!(IdSet::parse_mask(&top("1", 2048)).is_err());
    }

    #[test]
    fn hex_mask_words_wider_than_32_bits_are_errors() {
        // `100000000` (bit 32 in one word) used to parse as the empty set.
        let e = IdSet::parse_mask("100000000").unwrap_err().to_string();
        assert!(e.contains("32-bit hex word"), "{e}");
        assert!(IdSet::parse_mask("fffffffff,0").is_err());
        assert_eq!(IdSet::parse_mask("ffffffff").unwrap().to_string(), "0-31");
        assert_eq!(IdSet::parse_mask("000000001").unwrap().to_string(), "0");
    }

    #[test]
    fn typed_sets_serialize_as_lists() {
        let c = CpuSet::parse("0-1,4").unwrap();
        assert_eq!(serde_json::to_string(&c).unwrap(), "\"0-1,4\"");
        let back: CpuSet = serde_json::from_str("\"0-1,4\"").unwrap();
        assert_eq!(back, c);
        assert!(serde_json::from_str::<NodeSet>("\"a\"").is_err());
    }

    proptest! {
        #[test]
        fn print_parse_roundtrip(ids in proptest::collection::btree_set(0u32..300, 0..60)) {
            let s: IdSet = ids.iter().copied().collect();
            let printed = s.to_string();
            prop_assert_eq!(IdSet::parse(&printed).unwrap(), s);
        }
    }
}
