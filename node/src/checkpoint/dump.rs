//! The checksum input: a deterministic dump of a checkpoint's struct, printed as
//! apimachinery's `dump.ForHash` prints it (go-spew's `%#v` formatter with `SortKeys`,
//! `DisableMethods`, `SpewKeys`, `DisablePointerAddresses`, `DisableCapacities`), and
//! FNV-32a over it (upstream `pkg/kubelet/checkpointmanager/checksum/checksum.go` over
//! `pkg/util/hash/hash.go` `DeepHashObject`).
//!
//! Why a dump and not the JSON bytes: the dump is a function of the *values* only, so a file
//! that was re-marshalled, pretty-printed or hand-formatted (other field order, other
//! whitespace) still verifies, while any changed value does not. And because the dump prints
//! Go type names, skerry reproduces them exactly for the checkpoint types: a file an upstream
//! kubelet wrote verifies here and one written here verifies there (the tests hold upstream's
//! fixtures with their checksums).
//!
//! The shape of spew's `%#v` (`spew/format.go`): a value in a typed position is
//! `(type)value`; a top-level pointer `(*pkg.T){...}`; a struct `{Name:(type)value ...}`
//! (fields in declaration order, one space between); map entries and slice elements carry no
//! type (`map[k:v k:v]`, `[a b]`), a pointer there prints `<*>` before its value; strings
//! bare, integers in decimal; a nil slice `<nil>`, a nil map `map[]`; map keys sorted
//! (strings bytewise, integers numerically).

/// FNV-32a's offset basis (FNV specification; Go's `hash/fnv` `offset32`).
const FNV32_OFFSET_BASIS: u32 = 2_166_136_261;
/// FNV-32's prime (FNV specification; Go's `hash/fnv` `prime32`).
const FNV32_PRIME: u32 = 16_777_619;

/// FNV-32a of `bytes`, widened as upstream's `checksum.Checksum` (`uint64(hash.Sum32())`).
pub fn fnv32a(bytes: &[u8]) -> u64 {
    let mut h = FNV32_OFFSET_BASIS;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(FNV32_PRIME);
    }
    u64::from(h)
}

/// The checksum of a dump, after replacing the first `newer` type name by `older` (the
/// rename that lets an older kubelet verify a newer type's checkpoint: `strings.Replace(
/// object, "CPUManagerCheckpointV2", "CPUManagerCheckpoint", 1)`). `None` hashes as is.
pub fn checksum(dump: &str, rename: Option<(&str, &str)>) -> u64 {
    match rename {
        Some((newer, older)) => fnv32a(dump.replacen(newer, older, 1).as_bytes()),
        None => fnv32a(dump.as_bytes()),
    }
}

/// A dump being written.
#[derive(Default)]
pub struct Dump(pub String);

impl Dump {
    /// A top-level pointer to a struct: `(*pkg.T){fields}`.
    pub fn pointer_struct(go_type: &str, fields: impl FnOnce(&mut Fields<'_>)) -> Dump {
        let mut d = Dump::default();
        d.0.push_str("(*");
        d.0.push_str(go_type);
        d.0.push(')');
        d.struct_body(fields);
        d
    }

    /// A top-level struct value: `(pkg.T){fields}`.
    pub fn value_struct(go_type: &str, fields: impl FnOnce(&mut Fields<'_>)) -> Dump {
        let mut d = Dump::default();
        d.typed(go_type, |d| d.struct_body(fields));
        d
    }

    /// `(type)` then the value.
    pub fn typed(&mut self, go_type: &str, value: impl FnOnce(&mut Dump)) {
        self.0.push('(');
        self.0.push_str(go_type);
        self.0.push(')');
        value(self);
    }

    /// A struct's body: `{Name:(type)value ...}`.
    pub fn struct_body(&mut self, fields: impl FnOnce(&mut Fields<'_>)) {
        self.0.push('{');
        let mut f = Fields {
            dump: self,
            first: true,
        };
        fields(&mut f);
        self.0.push('}');
    }

    /// A struct behind a pointer in an untyped position (a map value): `<*>{...}`.
    pub fn untyped_pointer_struct(&mut self, fields: impl FnOnce(&mut Fields<'_>)) {
        self.0.push_str("<*>");
        self.struct_body(fields);
    }

    /// A string (bare, as spew prints it).
    pub fn str(&mut self, s: &str) {
        self.0.push_str(s);
    }

    /// An integer in decimal.
    pub fn int(&mut self, n: impl std::fmt::Display) {
        self.0.push_str(&n.to_string());
    }

    /// A map's body from entries already in Go's sorted key order: `map[k:v k:v]`.
    pub fn map<I, K, V>(
        &mut self,
        entries: I,
        mut key: impl FnMut(&mut Dump, K),
        mut value: impl FnMut(&mut Dump, V),
    ) where
        I: IntoIterator<Item = (K, V)>,
    {
        self.0.push_str("map[");
        for (i, (k, v)) in entries.into_iter().enumerate() {
            if i > 0 {
                self.0.push(' ');
            }
            key(self, k);
            self.0.push(':');
            value(self, v);
        }
        self.0.push(']');
    }

    /// A slice's body: `<nil>` for a nil slice, else `[a b]`.
    pub fn slice<T>(&mut self, items: Option<&[T]>, mut item: impl FnMut(&mut Dump, &T)) {
        let Some(items) = items else {
            self.0.push_str("<nil>");
            return;
        };
        self.0.push('[');
        for (i, x) in items.iter().enumerate() {
            if i > 0 {
                self.0.push(' ');
            }
            item(self, x);
        }
        self.0.push(']');
    }
}

/// The fields of a struct being dumped.
pub struct Fields<'a> {
    dump: &'a mut Dump,
    first: bool,
}

impl Fields<'_> {
    /// One field: `Name:(type)value`.
    pub fn field(&mut self, name: &str, go_type: &str, value: impl FnOnce(&mut Dump)) {
        if !self.first {
            self.dump.0.push(' ');
        }
        self.first = false;
        self.dump.0.push_str(name);
        self.dump.0.push(':');
        self.dump.typed(go_type, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv32a_matches_the_specification_vectors() {
        // FNV test vectors (the FNV specification's appendix): "" and "a".
        assert_eq!(fnv32a(b""), 0x811c_9dc5);
        assert_eq!(fnv32a(b"a"), 0xe40c_292c);
        assert_eq!(fnv32a(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn the_dump_prints_as_spew_does() {
        let d = Dump::pointer_struct("state.T", |f| {
            f.field("S", "string", |d| d.str("x"));
            f.field("M", "map[string]string", |d| {
                d.map([("a", "1"), ("b", "2")], |d, k| d.str(k), |d, v| d.str(v))
            });
            f.field("N", "[]int", |d| d.slice::<i64>(None, |d, x| d.int(x)));
            f.field("E", "[]int", |d| d.slice::<i64>(Some(&[]), |d, x| d.int(x)));
        });
        assert_eq!(
            d.0,
            "(*state.T){S:(string)x M:(map[string]string)map[a:1 b:2] N:([]int)<nil> E:([]int)[]}"
        );
    }
}
