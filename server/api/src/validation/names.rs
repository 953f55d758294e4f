//! String-format checks shared by every kind: DNS-1123 labels and subdomains, DNS-1035
//! labels, qualified names (label keys), label values, port names, config keys, env names.
//!
//! Each check returns the list of messages Kubernetes' `k8s.io/apimachinery/pkg/util/validation`
//! returns for the same input, word for word (clients and tests grep for them); the caller wraps
//! each message in a field cause. The regexes are written out as hand-rolled matchers, so this
//! crate needs no regex engine, and the regex text quoted in each message is Kubernetes' own.

/// DNS-1123 label length limit (RFC 1123 section 2.1, one label of a host name).
pub const DNS1123_LABEL_MAX_LEN: usize = 63;
/// DNS-1123 subdomain length limit (RFC 1123 section 2.1, a whole host name).
pub const DNS1123_SUBDOMAIN_MAX_LEN: usize = 253;
/// DNS-1035 label length limit (RFC 1035 section 2.3.4).
pub const DNS1035_LABEL_MAX_LEN: usize = 63;
/// The name part of a qualified name (label key) may be at most this long
/// (apimachinery `qualifiedNameMaxLength`).
pub const QUALIFIED_NAME_MAX_LEN: usize = 63;
/// Label values may be at most this long (apimachinery `LabelValueMaxLength`).
pub const LABEL_VALUE_MAX_LEN: usize = 63;
/// IANA service names (port names) are at most 15 characters (RFC 6335 section 5.1).
pub const PORT_NAME_MAX_LEN: usize = 15;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_ERR: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_ERR: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const CONFIG_KEY_FMT: &str = "[-._a-zA-Z0-9]+";
const CONFIG_KEY_ERR: &str =
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'";
const PERCENT_FMT: &str = "[0-9]+%";
const PERCENT_ERR: &str =
    "a valid percent string must be a numeric string followed by an ending '%'";

/// `must be no more than N characters` (apimachinery `MaxLenError`).
pub fn max_len_error(length: usize) -> String {
    format!("must be no more than {length} characters")
}

/// A message with examples and the regex, formatted as apimachinery's `RegexError` does
/// (including its double space before each "or").
pub fn regex_error(message: &str, format: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{message} (regex used for validation is '{format}')");
    }
    let mut out = format!("{message} (e.g. ");
    for (i, example) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{example}', "));
    }
    out.push_str(&format!("regex used for validation is '{format}')"));
    out
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn matches_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            is_lower_alnum(first)
                && is_lower_alnum(last)
                && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        }
        _ => false,
    }
}

fn matches_dns1123_subdomain(s: &str) -> bool {
    s.split('.').all(matches_dns1123_label)
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn matches_qualified_name(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter()
                    .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
        }
        _ => false,
    }
}

/// RFC 1123 label (namespace names, container names, port names of services).
pub fn dns1123_label(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LEN {
        errors.push(max_len_error(DNS1123_LABEL_MAX_LEN));
    }
    if !matches_dns1123_label(value) {
        if matches_dns1123_subdomain(value) {
            // A valid subdomain but not a valid label: length was checked, so it is the dots.
            errors.push("must not contain dots".to_string());
        } else {
            errors.push(regex_error(
                DNS1123_LABEL_ERR,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errors
}

/// RFC 1123 subdomain (most object names).
pub fn dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LEN {
        errors.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LEN));
    }
    if !matches_dns1123_subdomain(value) {
        errors.push(regex_error(
            DNS1123_SUBDOMAIN_ERR,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errors
}

/// RFC 1035 label (service names: they become DNS names and environment variables).
pub fn dns1035_label(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1035_LABEL_MAX_LEN {
        errors.push(max_len_error(DNS1035_LABEL_MAX_LEN));
    }
    let starts_alpha = value
        .as_bytes()
        .first()
        .is_some_and(|c| c.is_ascii_lowercase());
    if !(starts_alpha && matches_dns1123_label(value)) {
        errors.push(regex_error(
            DNS1035_LABEL_ERR,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errors
}

/// A path segment name (RBAC names): anything that can sit between two slashes of a URL.
pub fn path_segment_name(value: &str) -> Vec<String> {
    if value == "." || value == ".." {
        return vec![format!("may not be '{value}'")];
    }
    let mut errors = Vec::new();
    for illegal in ["/", "%"] {
        if value.contains(illegal) {
            errors.push(format!("may not contain '{illegal}'"));
        }
    }
    errors
}

/// A qualified name: an optional DNS subdomain prefix and '/', then a name part
/// (label keys, annotation keys, finalizers).
pub fn qualified_name(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_string());
            } else {
                for message in dns1123_subdomain(prefix) {
                    errors.push(format!("prefix part {message}"));
                }
            }
            *name
        }
        _ => {
            errors.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errors;
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_string());
    } else if name.len() > QUALIFIED_NAME_MAX_LEN {
        errors.push(format!(
            "name part {}",
            max_len_error(QUALIFIED_NAME_MAX_LEN)
        ));
    }
    if !matches_qualified_name(name) {
        errors.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_ERR,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errors
}

/// A label value: empty, or a qualified name part.
pub fn label_value(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LEN {
        errors.push(max_len_error(LABEL_VALUE_MAX_LEN));
    }
    if !value.is_empty() && !matches_qualified_name(value) {
        errors.push(regex_error(
            LABEL_VALUE_ERR,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errors
}

/// A key of a ConfigMap or Secret: it becomes a file name in a volume.
pub fn config_map_key(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LEN {
        errors.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LEN));
    }
    let charset_ok = !value.is_empty()
        && value
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.');
    if !charset_ok {
        errors.push(regex_error(
            CONFIG_KEY_ERR,
            CONFIG_KEY_FMT,
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    errors.extend(chdir_prefix(value));
    errors
}

/// `.` and `..` would escape the volume directory.
fn chdir_prefix(value: &str) -> Vec<String> {
    if value == "." {
        vec!["must not be '.'".to_string()]
    } else if value == ".." {
        vec!["must not be '..'".to_string()]
    } else if value.starts_with("..") {
        vec!["must not start with '..'".to_string()]
    } else {
        Vec::new()
    }
}

/// A port number: 1 to 65535.
pub fn port_number(port: i64) -> Vec<String> {
    if (1..=65535).contains(&port) {
        Vec::new()
    } else {
        vec!["must be between 1 and 65535, inclusive".to_string()]
    }
}

/// An IANA service name used as a port name (RFC 6335 section 5.1).
pub fn port_name(port: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if port.len() > PORT_NAME_MAX_LEN {
        errors.push(max_len_error(PORT_NAME_MAX_LEN));
    }
    if port.is_empty() || !port.bytes().all(|c| is_lower_alnum(c) || c == b'-') {
        errors.push(
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_string(),
        );
    }
    if !port.bytes().any(|c| c.is_ascii_lowercase()) {
        errors.push("must contain at least one letter (a-z)".to_string());
    }
    if port.contains("--") {
        errors.push("must not contain consecutive hyphens".to_string());
    }
    if port.starts_with('-') || port.ends_with('-') {
        errors.push("must not begin or end with a hyphen".to_string());
    }
    errors
}

/// An environment variable name, with the relaxed rule that is on by default in 1.32
/// (feature RelaxedEnvironmentVariableValidation): printable ASCII except '='.
pub fn env_var_name(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.is_empty() {
        errors.push("environment variable name must be non-empty".to_string());
    }
    if value.chars().any(|c| !(' '..='~').contains(&c) || c == '=') {
        errors.push(
            "a valid environment variable name must consist only of printable ASCII characters other than '='"
                .to_string(),
        );
    }
    errors
}

/// `25%`: a percentage of an IntOrString field.
pub fn percent(value: &str) -> Vec<String> {
    let digits = value.strip_suffix('%').unwrap_or("");
    if !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit()) {
        Vec::new()
    } else {
        vec![regex_error(PERCENT_ERR, PERCENT_FMT, &["1%", "93%"])]
    }
}

/// A generated name only needs to be a valid prefix: a trailing dash is allowed because a
/// random suffix follows (apimachinery `maskTrailingDash`).
pub fn mask_trailing_dash(name: &str) -> String {
    if name.len() > 1 && name.ends_with('-') {
        format!("{}a", &name[..name.len() - 1])
    } else {
        name.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reference: apimachinery pkg/util/validation, the messages users see in kubectl errors.
    #[test]
    fn subdomain_message_matches_kubernetes() {
        assert!(dns1123_subdomain("web-1.example").is_empty());
        assert_eq!(
            dns1123_subdomain("Web"),
            vec![
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ]
        );
        assert_eq!(
            dns1123_subdomain(&"a".repeat(254))[0],
            "must be no more than 253 characters"
        );
    }

    #[test]
    fn label_messages_match_kubernetes() {
        assert_eq!(
            dns1123_label("my_name"),
            vec![
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            ]
        );
        assert_eq!(dns1123_label("a.b"), vec!["must not contain dots"]);
        assert_eq!(
            dns1035_label("1abc"),
            vec![
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
            ]
        );
    }

    #[test]
    fn qualified_names() {
        assert!(qualified_name("app.kubernetes.io/name").is_empty());
        assert!(qualified_name("app").is_empty());
        assert_eq!(
            qualified_name("/app"),
            vec!["prefix part must be non-empty"]
        );
        assert_eq!(
            qualified_name("a/b/c"),
            vec![
                "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            ]
        );
        let empty = qualified_name("example.com/");
        assert_eq!(empty[0], "name part must be non-empty");
        assert_eq!(
            empty.len(),
            2,
            "an empty name part also fails the regex: {empty:?}"
        );
        assert_eq!(
            qualified_name(&"a".repeat(64))[0],
            "name part must be no more than 63 characters"
        );
    }

    #[test]
    fn label_values() {
        assert!(label_value("").is_empty());
        assert!(label_value("v1.2_3-x").is_empty());
        assert_eq!(
            label_value("-bad"),
            vec![
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
            ]
        );
    }

    #[test]
    fn ports_and_keys() {
        assert!(port_number(80).is_empty());
        assert_eq!(
            port_number(0),
            vec!["must be between 1 and 65535, inclusive"]
        );
        assert_eq!(port_number(65536).len(), 1);
        assert!(port_name("http-alt").is_empty());
        assert_eq!(
            port_name("8080"),
            vec!["must contain at least one letter (a-z)"]
        );
        assert_eq!(
            port_name("a--b"),
            vec!["must not contain consecutive hyphens"]
        );
        assert!(config_map_key("app.properties").is_empty());
        assert_eq!(config_map_key("..x"), vec!["must not start with '..'"]);
        assert_eq!(config_map_key("a/b").len(), 1);
        assert!(percent("25%").is_empty());
        assert_eq!(percent("25").len(), 1);
        assert_eq!(mask_trailing_dash("web-"), "weba");
        assert_eq!(path_segment_name("a/b"), vec!["may not contain '/'"]);
        assert!(env_var_name("MY VAR").is_empty());
        assert_eq!(env_var_name("A=B").len(), 1);
    }
}
