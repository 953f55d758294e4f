//! Go's `strconv.Quote`, which Kubernetes' messages and files use wherever Go writes `%q`:
//! label selector and node affinity errors, the downward API's `key="value"` files. Byte for
//! byte what Go writes, so texts compare equal to upstream's.

/// Go's `strconv.Quote`: `"` and `\` escaped, the usual short escapes, other non-printable
/// characters as `\xNN`, `\uNNNN` or `\UNNNNNNNN`; printable Unicode kept as it is.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if !is_go_printable(c) => {
                if (c as u32) < 0x10000 {
                    out.push_str(&format!("\\u{:04x}", c as u32));
                } else {
                    out.push_str(&format!("\\U{:08x}", c as u32));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `unicode.IsPrint` for what matters here: the C1 controls, the separators other than
/// the ASCII space, and the format and private-use characters Rust can name are escaped.
fn is_go_printable(c: char) -> bool {
    !(c.is_control()
        || matches!(
            c,
            '\u{a0}' | '\u{ad}' | '\u{2028}' | '\u{2029}' | '\u{feff}'
        )
        || ('\u{2000}'..='\u{200f}').contains(&c)
        || ('\u{e000}'..='\u{f8ff}').contains(&c))
}
