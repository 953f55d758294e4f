//! Static bearer tokens: `--token-auth-file`, in Kubernetes' CSV format
//! `token,user,uid,"group1,group2"`, and the `Authorization: Bearer` header.
//!
//! The file is parsed with the rules of Go's `encoding/csv` as Kubernetes' `tokenfile` reads it:
//! fields may be double-quoted (a quote inside doubled, newlines allowed), a quote inside an
//! unquoted field is an error, blank lines are skipped, rows may have different lengths. A row
//! needs at least three columns; the fourth, if any, is the comma-separated group list. A row
//! with an empty token is skipped and a repeated token replaces the earlier row, as in
//! Kubernetes; both leave a warning in [`TokenFile::warnings`].
//!
//! Invariant: every error is one line naming the line (and column) of the file where it is.

use std::collections::HashMap;
use std::path::Path;

use super::UserInfo;

/// The largest token file read. A token file is written by an administrator and holds one
/// short line per user; 16 MiB is over 100,000 users. Semi-arbitrary: it only stops a wrong
/// path (a disk image, a log) from being read into memory.
pub const TOKEN_FILE_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// Why a token file cannot be used. `Display` is one line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenFileError {
    /// The file could not be read.
    #[error("token file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than [`TOKEN_FILE_BYTES_MAX`].
    #[error("token file {path}: {size} bytes is more than the {TOKEN_FILE_BYTES_MAX} allowed")]
    TooLarge {
        /// The file.
        path: String,
        /// Its size.
        size: u64,
    },
    /// The file is not UTF-8.
    #[error("token file is not UTF-8 text (byte {offset})")]
    NotUtf8 {
        /// The byte offset of the first invalid byte.
        offset: usize,
    },
    /// A CSV syntax error.
    #[error("token file line {line}, column {column}: {problem}")]
    Syntax {
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column (in characters) of the problem.
        column: usize,
        /// What is wrong.
        problem: &'static str,
    },
    /// A row with fewer than three columns.
    #[error(
        "token file line {line}: a row needs at least 3 columns (token, user name, user uid), found {found}"
    )]
    TooFewColumns {
        /// 1-based line where the row starts.
        line: usize,
        /// Columns found.
        found: usize,
    },
}

/// A parsed token file: token → user. `Debug` shows no token.
#[derive(Default)]
pub struct TokenFile {
    /// Token → user. A `HashMap` with std's per-process random SipHash keys, as Kubernetes uses a
    /// Go map; lookups are by the whole token.
    users: HashMap<String, UserInfo>,
    /// Rows skipped or replaced, one line each, for the caller to log.
    pub warnings: Vec<String>,
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFile")
            .field("tokens", &self.users.len())
            .field("warnings", &self.warnings)
            .finish()
    }
}

impl TokenFile {
    /// Reads and parses the file at `path`.
    pub fn load(path: &Path) -> Result<TokenFile, TokenFileError> {
        let shown = path.display().to_string();
        let read_error = |source| TokenFileError::Read {
            path: shown.clone(),
            source,
        };
        let size = std::fs::metadata(path).map_err(read_error)?.len();
        if size > TOKEN_FILE_BYTES_MAX {
            return Err(TokenFileError::TooLarge { path: shown, size });
        }
        let bytes = std::fs::read(path).map_err(read_error)?;
        let text = std::str::from_utf8(&bytes).map_err(|e| TokenFileError::NotUtf8 {
            offset: e.valid_up_to(),
        })?;
        TokenFile::parse(text)
    }

    /// Parses the text of a token file.
    pub fn parse(text: &str) -> Result<TokenFile, TokenFileError> {
        let mut file = TokenFile::default();
        for (line, record) in parse_csv(text)? {
            let [token, name, uid, rest @ ..] = record.as_slice() else {
                return Err(TokenFileError::TooFewColumns {
                    line,
                    found: record.len(),
                });
            };
            if token.is_empty() {
                file.warnings
                    .push(format!("token file line {line}: empty token, row skipped"));
                continue;
            }
            let groups = match rest.first() {
                Some(groups) => groups.split(',').map(str::to_string).collect(),
                None => Vec::new(),
            };
            let user = UserInfo::authenticated(name.as_str(), uid.as_str(), groups);
            if file.users.insert(token.clone(), user).is_some() {
                file.warnings.push(format!(
                    "token file line {line}: duplicate token, this row replaces the earlier one"
                ));
            }
        }
        Ok(file)
    }

    /// The user a token belongs to.
    pub fn authenticate(&self, token: &str) -> Option<UserInfo> {
        self.users.get(token).cloned()
    }

    /// How many tokens the file holds.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// Whether the file holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

/// The token of an `Authorization` header value, as Kubernetes' bearer-token authenticator reads
/// it: trimmed, split on spaces, scheme `Bearer` in any case, a non-empty token.
pub fn bearer_token(header: &str) -> Option<&str> {
    let mut parts = header.trim().splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Parses CSV text into records, each with the 1-based line it starts on.
fn parse_csv(text: &str) -> Result<Vec<(usize, Vec<String>)>, TokenFileError> {
    let mut records = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    let mut column = 0;
    while chars.peek().is_some() {
        let start_line = line;
        let mut record = Vec::new();
        let mut field = String::new();
        // Blank lines (just a newline) are no record at all.
        if matches!(chars.peek(), Some('\n')) || starts_with_crlf(&chars) {
            skip_newline(&mut chars);
            line += 1;
            column = 0;
            continue;
        }
        loop {
            // At the start of a field.
            if chars.peek() == Some(&'"') {
                chars.next();
                column += 1;
                let (open_line, open_column) = (line, column);
                loop {
                    match chars.next() {
                        None => {
                            return Err(syntax(
                                open_line,
                                open_column,
                                "quoted field is never closed",
                            ));
                        }
                        Some('"') => {
                            column += 1;
                            if chars.peek() == Some(&'"') {
                                chars.next();
                                column += 1;
                                field.push('"');
                            } else {
                                break;
                            }
                        }
                        Some('\n') => {
                            line += 1;
                            column = 0;
                            field.push('\n');
                        }
                        Some(c) => {
                            column += 1;
                            field.push(c);
                        }
                    }
                }
                // After a closing quote: a comma, the end of the line or of the text.
                match chars.peek().copied() {
                    None => break,
                    Some(',') => {
                        chars.next();
                        column += 1;
                        record.push(std::mem::take(&mut field));
                        continue;
                    }
                    Some('\n') => break,
                    Some('\r') if starts_with_crlf(&chars) => break,
                    Some(_) => {
                        return Err(syntax(
                            line,
                            column + 1,
                            "extraneous or missing \" in quoted field",
                        ));
                    }
                }
            }
            // An unquoted field, up to a comma or the end of the line.
            loop {
                match chars.peek().copied() {
                    None | Some('\n') => break,
                    Some('\r') if starts_with_crlf(&chars) => break,
                    Some(',') => break,
                    Some('"') => {
                        return Err(syntax(line, column + 1, "bare \" in non-quoted field"));
                    }
                    Some(c) => {
                        chars.next();
                        column += 1;
                        field.push(c);
                    }
                }
            }
            if chars.peek() == Some(&',') {
                chars.next();
                column += 1;
                record.push(std::mem::take(&mut field));
                continue;
            }
            break;
        }
        record.push(field);
        skip_newline(&mut chars);
        line += 1;
        column = 0;
        records.push((start_line, record));
    }
    Ok(records)
}

fn starts_with_crlf(chars: &std::iter::Peekable<std::str::Chars<'_>>) -> bool {
    let mut ahead = chars.clone();
    ahead.next() == Some('\r') && ahead.next() == Some('\n')
}

fn skip_newline(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    if chars.peek() == Some(&'\r') && starts_with_crlf(chars) {
        chars.next();
    }
    if chars.peek() == Some(&'\n') {
        chars.next();
    }
}

fn syntax(line: usize, column: usize, problem: &'static str) -> TokenFileError {
    TokenFileError::Syntax {
        line,
        column,
        problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::GROUP_AUTHENTICATED;

    #[test]
    fn rows_become_users() {
        let file = TokenFile::parse(
            "t1,alice,1001,\"system:masters,dev\"\n\
             \n\
             t2,bob,1002\r\n\
             t3,\"carol \"\"cc\"\"\",1003,ops\n",
        )
        .expect("valid file");
        assert_eq!(file.len(), 3);
        let alice = file.authenticate("t1").expect("t1");
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.uid, "1001");
        assert_eq!(alice.groups, ["system:masters", "dev", GROUP_AUTHENTICATED]);
        let bob = file.authenticate("t2").expect("t2");
        assert_eq!(bob.groups, [GROUP_AUTHENTICATED]);
        assert_eq!(file.authenticate("t3").expect("t3").name, "carol \"cc\"");
        assert_eq!(
            file.authenticate("t3").expect("t3").groups,
            ["ops", GROUP_AUTHENTICATED]
        );
        assert!(file.authenticate("t4").is_none());
        assert!(file.authenticate("").is_none());
        assert!(file.warnings.is_empty());
        assert!(
            !format!("{file:?}").contains("t1"),
            "Debug must not show tokens"
        );
    }

    #[test]
    fn empty_and_duplicate_tokens_warn() {
        let file = TokenFile::parse(",nobody,0\nt,first,1\nt,second,2\n").expect("valid file");
        assert_eq!(file.authenticate("t").expect("t").name, "second");
        assert_eq!(file.warnings.len(), 2);
        assert!(file.warnings[0].contains("line 1"), "{:?}", file.warnings);
        assert!(file.warnings[1].contains("line 3"), "{:?}", file.warnings);
    }

    #[test]
    fn errors_are_one_line_with_their_place() {
        let cases = [
            (
                "t,alice\n",
                "token file line 1: a row needs at least 3 columns (token, user name, user uid), found 2",
            ),
            (
                "t,a,1\nx\n",
                "token file line 2: a row needs at least 3 columns (token, user name, user uid), found 1",
            ),
            (
                "t,a\"b,1\n",
                "token file line 1, column 4: bare \" in non-quoted field",
            ),
            (
                "t,\"a\"b,1\n",
                "token file line 1, column 6: extraneous or missing \" in quoted field",
            ),
            (
                "t,a,1,\"g1,g2\n",
                "token file line 1, column 7: quoted field is never closed",
            ),
        ];
        for (text, want) in cases {
            let err = TokenFile::parse(text).expect_err(text).to_string();
            assert_eq!(err, want, "{text:?}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn load_refuses_missing_and_non_utf8_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("nope.csv");
        let err = TokenFile::load(&missing).expect_err("missing").to_string();
        assert!(
            err.starts_with("token file ") && err.contains("nope.csv"),
            "{err}"
        );
        let binary = dir.path().join("bin.csv");
        std::fs::write(&binary, b"t,a,1\n\xff\xfe").expect("write");
        assert_eq!(
            TokenFile::load(&binary).expect_err("binary").to_string(),
            "token file is not UTF-8 text (byte 6)"
        );
        let good = dir.path().join("good.csv");
        std::fs::write(&good, "tok,admin,1,system:masters\n").expect("write");
        let file = TokenFile::load(&good).expect("good");
        assert!(
            file.authenticate("tok")
                .expect("tok")
                .in_group("system:masters")
        );
    }

    #[test]
    fn bearer_header() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("  bearer abc  "), Some("abc"));
        assert_eq!(bearer_token("BEARER abc extra"), Some("abc"));
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token(""), None);
    }
}
