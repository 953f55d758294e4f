//! `labels.Parse`: the string syntax of label selectors (`app=web,tier notin (db),!canary`),
//! as apimachinery's lexer and recursive-descent parser read it, token for token and message
//! for message (`k8s.io/apimachinery/pkg/labels/selector.go`: `Lexer`, `Parser`).
//!
//! The quirks kept because clients see them: `in` and `notin` are keywords only where an
//! operator may stand (`in in (in)` is the key `in` in the set {"in"}); `x in ()` and
//! `x in (a,)` hold the empty value; `x=` is `x` equal to ""; a NUL byte ends the input; a
//! key that is not a qualified name is reported at Kubernetes' nil field path (`<nil>:
//! Invalid value: ...`), every other requirement error at `key` / `values[i][key]`.

use std::collections::BTreeSet;

use super::label::{
    LabelOp, Operator, SELECTOR_REQUIREMENTS_MAX, go_quote, invalid, new_requirement,
};
use crate::validation::names;

/// The lexer's tokens (apimachinery's `Token`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    Error,
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

/// The literal tokens (apimachinery's `string2token`).
fn literal_token(text: &[u8]) -> Option<Token> {
    Some(match text {
        b")" => Token::ClosedPar,
        b"," => Token::Comma,
        b"!" => Token::DoesNotExist,
        b"==" => Token::DoubleEquals,
        b"=" => Token::Equals,
        b">" => Token::GreaterThan,
        b"in" => Token::In,
        b"<" => Token::LessThan,
        b"!=" => Token::NotEquals,
        b"notin" => Token::NotIn,
        b"(" => Token::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special(c: u8) -> bool {
    matches!(c, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

fn text(bytes: &[u8]) -> String {
    // Token boundaries are ASCII bytes, so every slice is whole UTF-8.
    String::from_utf8_lossy(bytes).into_owned()
}

struct Lexer<'a> {
    input: &'a [u8],
    pos: usize,
}

impl Lexer<'_> {
    /// The next byte, 0 at the end (so, as in Go, a NUL byte reads as the end).
    fn read(&mut self) -> u8 {
        match self.input.get(self.pos) {
            Some(&c) => {
                self.pos += 1;
                c
            }
            None => 0,
        }
    }

    fn unread(&mut self) {
        self.pos = self.pos.saturating_sub(1);
    }

    fn scan_identifier_or_keyword(&mut self) -> (Token, String) {
        let mut buffer = Vec::new();
        loop {
            match self.read() {
                0 => break,
                c if is_special(c) || is_whitespace(c) => {
                    self.unread();
                    break;
                }
                c => buffer.push(c),
            }
        }
        match literal_token(&buffer) {
            Some(token) => (token, text(&buffer)),
            None => (Token::Identifier, text(&buffer)),
        }
    }

    /// The longest operator made of special characters.
    fn scan_special_symbol(&mut self) -> (Token, String) {
        let mut buffer = Vec::new();
        let mut last: Option<(Token, usize)> = None;
        loop {
            match self.read() {
                0 => break,
                c if is_special(c) => {
                    buffer.push(c);
                    if let Some(token) = literal_token(&buffer) {
                        last = Some((token, buffer.len()));
                    } else if last.is_some() {
                        self.unread();
                        break;
                    }
                }
                _ => {
                    self.unread();
                    break;
                }
            }
        }
        match last {
            Some((token, len)) => (token, text(&buffer[..len])),
            None => (
                Token::Error,
                format!("error expected: keyword found '{}'", text(&buffer)),
            ),
        }
    }

    fn lex(&mut self) -> (Token, String) {
        let mut c = self.read();
        while is_whitespace(c) {
            c = self.read();
        }
        if c == 0 {
            return (Token::EndOfString, String::new());
        }
        self.unread();
        if is_special(c) {
            self.scan_special_symbol()
        } else {
            self.scan_identifier_or_keyword()
        }
    }
}

/// Where the parser is: after a key an `in` is the operator, among values it is a value.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

struct Parser {
    items: Vec<(Token, String)>,
    position: usize,
}

impl Parser {
    fn new(input: &str) -> Parser {
        let mut lexer = Lexer {
            input: input.as_bytes(),
            pos: 0,
        };
        let mut items = Vec::new();
        loop {
            let item = lexer.lex();
            let end = item.0 == Token::EndOfString;
            items.push(item);
            if end {
                break;
            }
        }
        Parser { items, position: 0 }
    }

    fn item(&self, at: usize, context: Context) -> (Token, &str) {
        let (token, literal) = self
            .items
            .get(at)
            .map_or((Token::EndOfString, ""), |(t, l)| (*t, l.as_str()));
        match (context, token) {
            (Context::Values, Token::In | Token::NotIn) => (Token::Identifier, literal),
            _ => (token, literal),
        }
    }

    fn lookahead(&self, context: Context) -> (Token, &str) {
        self.item(self.position, context)
    }

    fn consume(&mut self, context: Context) -> (Token, String) {
        let at = self.position;
        self.position += 1;
        let (token, literal) = self.item(at, context);
        (token, literal.to_string())
    }

    fn parse(&mut self) -> Result<Vec<(String, LabelOp)>, String> {
        let mut requirements = Vec::new();
        loop {
            let (token, literal) = self.lookahead(Context::Values);
            match token {
                Token::Identifier | Token::DoesNotExist => {
                    if requirements.len() >= SELECTOR_REQUIREMENTS_MAX {
                        return Err(format!(
                            "unable to parse requirement: more than {SELECTOR_REQUIREMENTS_MAX} requirements"
                        ));
                    }
                    let requirement = self
                        .parse_requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    requirements.push(requirement);
                    let (token, literal) = self.consume(Context::Values);
                    match token {
                        Token::EndOfString => return Ok(requirements),
                        Token::Comma => {
                            let (next, literal) = self.lookahead(Context::Values);
                            if next != Token::Identifier && next != Token::DoesNotExist {
                                return Err(format!(
                                    "found '{literal}', expected: identifier after ','"
                                ));
                            }
                        }
                        _ => {
                            return Err(format!(
                                "found '{literal}', expected: ',' or 'end of string'"
                            ));
                        }
                    }
                }
                Token::EndOfString => return Ok(requirements),
                _ => {
                    return Err(format!(
                        "found '{literal}', expected: !, identifier, or 'end of string'"
                    ));
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<(String, LabelOp), String> {
        let (key, operator) = self.parse_key_and_infer_operator()?;
        if let Some(operator @ (Operator::Exists | Operator::DoesNotExist)) = operator {
            return new_requirement(&key, operator, Some(&[]), None);
        }
        let operator = self.parse_operator()?;
        let values = match operator {
            Operator::In | Operator::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        let values: Vec<String> = values.into_iter().collect();
        new_requirement(&key, operator, Some(&values), None)
    }

    /// The key, and `Exists` / `DoesNotExist` when no operator follows it.
    fn parse_key_and_infer_operator(&mut self) -> Result<(String, Option<Operator>), String> {
        let mut operator = None;
        let (mut token, mut literal) = self.consume(Context::Values);
        if token == Token::DoesNotExist {
            operator = Some(Operator::DoesNotExist);
            (token, literal) = self.consume(Context::Values);
        }
        if token != Token::Identifier {
            return Err(format!("found '{literal}', expected: identifier"));
        }
        let key_errors = names::qualified_name(&literal);
        if !key_errors.is_empty() {
            // Kubernetes checks the key here at the parser's nil path.
            return Err(invalid(
                "<nil>",
                &go_quote(&literal),
                &key_errors.join("; "),
            ));
        }
        let (next, _) = self.lookahead(Context::Values);
        if (next == Token::EndOfString || next == Token::Comma)
            && operator != Some(Operator::DoesNotExist)
        {
            operator = Some(Operator::Exists);
        }
        Ok((literal, operator))
    }

    fn parse_operator(&mut self) -> Result<Operator, String> {
        let (token, literal) = self.consume(Context::KeyAndOperator);
        Ok(match token {
            Token::In => Operator::In,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            _ => {
                return Err(format!(
                    "found '{literal}', expected: in, notin, =, ==, !=, gt, lt"
                ));
            }
        })
    }

    /// `(a,b,...)`, sorted and without duplicates (Kubernetes collects them in a set).
    fn parse_values(&mut self) -> Result<BTreeSet<String>, String> {
        let (token, literal) = self.consume(Context::Values);
        if token != Token::OpenPar {
            return Err(format!("found '{literal}' expected: '('"));
        }
        let (token, literal) = self.lookahead(Context::Values);
        let literal = literal.to_string();
        match token {
            Token::Identifier | Token::Comma => {
                let values = self.parse_identifiers_list()?;
                if self.consume(Context::Values).0 != Token::ClosedPar {
                    return Err(format!("found '{literal}', expected: ')'"));
                }
                Ok(values)
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(BTreeSet::from([String::new()]))
            }
            _ => Err(format!(
                "found '{literal}', expected: ',', ')' or identifier"
            )),
        }
    }

    /// Comma-separated, possibly empty identifiers up to (not including) `)`.
    fn parse_identifiers_list(&mut self) -> Result<BTreeSet<String>, String> {
        let mut values = BTreeSet::new();
        loop {
            let (token, literal) = self.consume(Context::Values);
            match token {
                Token::Identifier => {
                    values.insert(literal);
                    let (next, literal) = self.lookahead(Context::Values);
                    match next {
                        Token::Comma => {}
                        Token::ClosedPar => return Ok(values),
                        _ => return Err(format!("found '{literal}', expected: ',' or ')'")),
                    }
                }
                Token::Comma => {
                    if values.is_empty() {
                        values.insert(String::new());
                    }
                    match self.lookahead(Context::Values).0 {
                        Token::ClosedPar => {
                            values.insert(String::new());
                            return Ok(values);
                        }
                        Token::Comma => {
                            values.insert(String::new());
                        }
                        _ => {}
                    }
                }
                _ => return Err(format!("found '{literal}', expected: ',', or identifier")),
            }
        }
    }

    /// The single value of `=`, `==`, `!=`, `>`, `<`; nothing before `,` or the end is "".
    fn parse_exact_value(&mut self) -> Result<BTreeSet<String>, String> {
        let (token, _) = self.lookahead(Context::Values);
        if token == Token::EndOfString || token == Token::Comma {
            return Ok(BTreeSet::from([String::new()]));
        }
        let (token, literal) = self.consume(Context::Values);
        if token == Token::Identifier {
            Ok(BTreeSet::from([literal]))
        } else {
            Err(format!("found '{literal}', expected: identifier"))
        }
    }
}

/// Parses `input` as `labels.Parse` does; the error is Kubernetes' message.
pub(super) fn parse(input: &str) -> Result<Vec<(String, LabelOp)>, String> {
    Parser::new(input).parse()
}
