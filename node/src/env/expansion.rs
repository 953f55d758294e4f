//! `$(VAR)` references in env values, `command`, `args` and `subPathExpr`, with the rules of
//! Kubernetes' `third_party/forked/golang/expansion/expand.go` (`Expand`, `MappingFuncFor`):
//!
//! - `$(NAME)` is replaced by the mapping's value for `NAME`; a name the mapping does not know
//!   is left as written, `$(NAME)`, so a literal survives a missing variable;
//! - `$$` is an escaped `$`: it becomes one `$` and what follows is not a reference
//!   (`$$(A)` gives `$(A)`);
//! - a `$(` with no closing `)` is left as it is, and so is a `$` before any other character
//!   or at the end of the input;
//! - there is no nesting and no recursion: the replacement is never expanded again.
//!
//! The one difference from the Go code: it reads bytes and writes the byte after a lone `$`
//! as a code point, which corrupts a multi-byte character there (`$é`); this works on
//! characters, so such input comes out unchanged, as the rules above say it should.

/// A mapping from a variable name to its value; `None` leaves the reference as written.
pub trait Mapping {
    /// The value of `name`, if it is known.
    fn lookup(&self, name: &str) -> Option<String>;
}

impl<F: Fn(&str) -> Option<String>> Mapping for F {
    fn lookup(&self, name: &str) -> Option<String> {
        self(name)
    }
}

/// Expands the `$(VAR)` references of `input` through `mapping`, with upstream's rules.
pub fn expand(input: &str, mapping: &dyn Mapping) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        match after.chars().next() {
            // A `$` at the very end is copied as it is.
            None => {
                out.push('$');
                rest = after;
            }
            // `$$`: an escaped operator.
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('(') => match after[1..].find(')') {
                Some(close) => {
                    let name = &after[1..1 + close];
                    match mapping.lookup(name) {
                        Some(value) => out.push_str(&value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &after[1 + close + 1..];
                }
                // An incomplete reference: `$(` is copied, the scan goes on after it.
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            // A `$` that opens nothing: it and the character after it are copied.
            Some(c) => {
                out.push('$');
                out.push(c);
                rest = &after[c.len_utf8()..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Upstream's `MappingFuncFor`: the first of `contexts` that holds the name answers.
pub fn mapping_for<'a>(
    contexts: &'a [&'a std::collections::BTreeMap<String, String>],
) -> impl Fn(&str) -> Option<String> + 'a {
    move |name| contexts.iter().find_map(|c| c.get(name).cloned())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Upstream's `TestMapReference` / `TestMapping` tables, in our words: the variables and
    /// the expected expansion for each input.
    #[test]
    fn expands_as_kubernetes_does() {
        let vars: BTreeMap<String, String> = [
            ("VAR_A", "A"),
            ("VAR_B", "B"),
            ("VAR_C", "C"),
            ("VAR_REF", "$(VAR_A)"),
            ("VAR_EMPTY", ""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let contexts = [&vars];
        let map = mapping_for(&contexts);
        let cases = [
            ("$(VAR_A)", "A"),
            ("___$(VAR_B)___", "___B___"),
            ("$(VAR_A)-$(VAR_B)-$(VAR_C)", "A-B-C"),
            ("$(VAR_A)$(VAR_B)", "AB"),
            // The value of a reference is not expanded again.
            ("$(VAR_REF)", "$(VAR_A)"),
            ("$(VAR_EMPTY)", ""),
            ("foo$(VAR_EMPTY)bar", "foobar"),
            // Unknown references stay as written.
            ("$(UNKNOWN)", "$(UNKNOWN)"),
            ("$(VAR_A)$(UNKNOWN)", "A$(UNKNOWN)"),
            ("$()", "$()"),
            // Escapes.
            ("$$(VAR_A)", "$(VAR_A)"),
            ("$$$(VAR_A)", "$A"),
            ("$$$$(VAR_A)", "$$(VAR_A)"),
            ("$$", "$"),
            ("f00__(VAR_A)__", "f00__(VAR_A)__"),
            // Incomplete references.
            ("$(VAR_A", "$(VAR_A"),
            ("$(VAR_A)$(VAR_B", "A$(VAR_B"),
            ("$(", "$("),
            ("$(((", "$((("),
            // A lone operator.
            ("$", "$"),
            ("foo$", "foo$"),
            ("$VAR_A", "$VAR_A"),
            ("$ $", "$ $"),
            ("$)", "$)"),
            ("$$)", "$)"),
            ("$(VAR_A))", "A)"),
            // Nothing to do.
            ("", ""),
            ("plain", "plain"),
            // A name with spaces is a name like any other (and unknown here).
            ("$( VAR_A )", "$( VAR_A )"),
            // Characters after a lone `$` survive whole.
            ("$é$(VAR_A)", "$éA"),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, &map), want, "input {input:?}");
        }
    }

    #[test]
    fn the_first_context_that_knows_a_name_wins() {
        let first: BTreeMap<String, String> = [("X".to_string(), "1".to_string())].into();
        let second: BTreeMap<String, String> = [
            ("X".to_string(), "2".to_string()),
            ("Y".to_string(), "3".to_string()),
        ]
        .into();
        let contexts = [&first, &second];
        let map = mapping_for(&contexts);
        assert_eq!(expand("$(X)$(Y)$(Z)", &map), "13$(Z)");
    }
}
