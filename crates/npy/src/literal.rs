//! The Python literals of a `.npy` header, parsed without evaluating them.

use super::HeaderError;

/// Tuples nested deeper than this in a header are refused, so that recursion stays shallow.
const MAX_NESTING: usize = 16;

/// The Python literals a header holds.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value {
    Str(String),
    Bool(bool),
    Int(i128),
    None,
    /// A tuple or a list.
    Sequence(Vec<Value>),
}

/// A parser for the subset of Python literals that numpy writes in headers: a dict of strings,
/// booleans, integers (with Python 2's `L` suffix) and tuples or lists of them.
struct Parser {
    chars: Vec<char>,
    position: usize,
}

impl Parser {
    fn error(&self, what: &str) -> HeaderError {
        HeaderError::Syntax {
            position: self.position,
            what: what.to_owned(),
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.position).copied()
    }

    fn skip_whitespace(&mut self) {
        while self.peek().is_some_and(|c| matches!(c, ' ' | '\t' | '\n' | '\r')) {
            self.position += 1;
        }
    }

    fn expect(&mut self, wanted: char) -> Result<(), HeaderError> {
        self.skip_whitespace();
        if self.peek() == Some(wanted) {
            self.position += 1;
            Ok(())
        } else {
            Err(self.error(&format!("expected '{wanted}'")))
        }
    }

    /// Whether the next non-blank character is `wanted`; consumes it if so.
    fn accept(&mut self, wanted: char) -> bool {
        self.skip_whitespace();
        let found = self.peek() == Some(wanted);
        if found {
            self.position += 1;
        }
        found
    }

    fn dict(&mut self) -> Result<Vec<(String, Value)>, HeaderError> {
        self.expect('{')?;
        let mut entries = Vec::new();
        while !self.accept('}') {
            self.skip_whitespace();
            let Value::Str(key) = self.value(1)? else {
                return Err(self.error("dict keys must be strings"));
            };
            self.expect(':')?;
            let value = self.value(1)?;
            entries.push((key, value));
            if !self.accept(',') {
                self.expect('}')?;
                break;
            }
        }
        Ok(entries)
    }

    fn value(&mut self, depth: usize) -> Result<Value, HeaderError> {
        if depth > MAX_NESTING {
            return Err(self.error("nested too deeply"));
        }
        self.skip_whitespace();
        match self.peek() {
            Some(quote @ ('\'' | '"')) => self.string(quote),
            Some(open @ ('(' | '[')) => {
                let close = if open == '(' { ')' } else { ']' };
                self.position += 1;
                let mut items = Vec::new();
                while !self.accept(close) {
                    items.push(self.value(depth + 1)?);
                    if !self.accept(',') {
                        self.expect(close)?;
                        break;
                    }
                }
                Ok(Value::Sequence(items))
            }
            Some(c) if c.is_ascii_digit() || c == '-' => self.integer(),
            Some(c) if c.is_ascii_alphabetic() => {
                let start = self.position;
                while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                    self.position += 1;
                }
                let word: String = self.chars[start..self.position].iter().collect();
                match word.as_str() {
                    "True" => Ok(Value::Bool(true)),
                    "False" => Ok(Value::Bool(false)),
                    "None" => Ok(Value::None),
                    _ => {
                        self.position = start;
                        Err(self.error(&format!("unexpected name {word:?}")))
                    }
                }
            }
            Some(_) => Err(self.error("expected a value")),
            None => Err(self.error("the header ends early")),
        }
    }

    fn integer(&mut self) -> Result<Value, HeaderError> {
        let negative = self.peek() == Some('-');
        if negative {
            self.position += 1;
        }
        let start = self.position;
        let mut value: i128 = 0;
        while let Some(digit) = self.peek().and_then(|c| c.to_digit(10)) {
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(digit as i128))
                .filter(|v| *v <= u64::MAX as i128)
                .ok_or_else(|| self.error("integer too large"))?;
            self.position += 1;
        }
        if self.position == start {
            return Err(self.error("expected digits"));
        }
        // Python 2's long integers, as in headers numpy wrote then.
        if matches!(self.peek(), Some('L' | 'l')) {
            self.position += 1;
        }
        Ok(Value::Int(if negative { -value } else { value }))
    }

    fn string(&mut self, quote: char) -> Result<Value, HeaderError> {
        self.position += 1;
        let mut text = String::new();
        loop {
            match self.peek() {
                None => return Err(self.error("unterminated string")),
                Some(c) if c == quote => {
                    self.position += 1;
                    return Ok(Value::Str(text));
                }
                Some('\\') => {
                    self.position += 1;
                    match self.peek() {
                        None => return Err(self.error("unterminated string")),
                        Some('n') => text.push('\n'),
                        Some('t') => text.push('\t'),
                        Some(escaped) => text.push(escaped),
                    }
                    self.position += 1;
                }
                Some(c) => {
                    text.push(c);
                    self.position += 1;
                }
            }
        }
    }
}

/// The dict a header's text holds, and nothing after it but whitespace.
pub(super) fn parse_dict(text: &str) -> Result<Vec<(String, Value)>, HeaderError> {
    let mut parser = Parser {
        chars: text.chars().collect(),
        position: 0,
    };
    let entries = parser.dict()?;
    parser.skip_whitespace();
    if parser.position != parser.chars.len() {
        return Err(parser.error("unexpected text after the dict"));
    }
    Ok(entries)
}
