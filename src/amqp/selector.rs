//! JMS-style message selectors on AMQP receivers (connector-extra.md §3.8): the SQL-92 subset of
//! the filter `apache.org:selector-filter:string` (alias `jms-selector`), parsed once at ATTACH
//! and evaluated per message with three-valued logic (a comparison with a missing property is
//! unknown, and a message matches only when the whole selector is true).
//!
//! Grammar: identifiers; string (`'it''s'`), integer, decimal (`1.5`, `2e3`) and boolean
//! literals; `= <> < > <= >=`; `AND OR NOT`; `[NOT] IN ('a', …)`; `[NOT] LIKE 'p%t_' [ESCAPE
//! '!']`; `[NOT] BETWEEN a AND b`; `IS [NOT] NULL`; `+ - * /` on numbers; parentheses.
//! Keywords are case-insensitive, identifiers are not.
//!
//! Values: an identifier resolves through [`Lookup`]. The gateway's messages carry their
//! application properties as text tags, so an identifier's value is text, read as a number
//! when compared with or computed on a number, and as a boolean next to `TRUE`/`FALSE`; text
//! that is no number there makes the comparison unknown (as a JMS type mismatch).
//!
//! Bounds: at most [`MAX_TEXT`] bytes of text, [`MAX_NODES`] AST nodes and [`MAX_DEPTH`]
//! levels of nesting, checked while parsing (no recursion deeper than that, whatever the
//! input), so evaluation is bounded too. LIKE matches without backtracking recursion.

/// The longest selector text, bytes.
pub const MAX_TEXT: usize = 4096;
/// The most nodes a selector's syntax tree may have.
pub const MAX_NODES: usize = 64;
/// The deepest nesting of parentheses and unary operators.
pub const MAX_DEPTH: usize = 32;

/// Why a selector was refused: a short fixed description (never the selector's own text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invalid(pub &'static str);

/// Resolves an identifier in one message.
pub trait Lookup {
    fn lookup(&self, name: &str) -> Option<Val>;
}

#[derive(Clone, Debug, PartialEq)]
pub enum Val {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmp {
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Lit(Val),
    Ident(String),
    Neg(Box<Node>),
    Arith(Arith, Box<Node>, Box<Node>),
    Cmp(Cmp, Box<Node>, Box<Node>),
    And(Box<Node>, Box<Node>),
    Or(Box<Node>, Box<Node>),
    Not(Box<Node>),
    Between { e: Box<Node>, lo: Box<Node>, hi: Box<Node>, neg: bool },
    In { e: Box<Node>, list: Vec<String>, neg: bool },
    Like { e: Box<Node>, pattern: Vec<Pat>, neg: bool },
    IsNull { e: Box<Node>, neg: bool },
}

#[derive(Clone, Debug, PartialEq)]
enum Pat {
    Char(char),
    One,
    Any,
}

/// A parsed selector: [`Selector::matches`] per message.
#[derive(Clone, Debug, PartialEq)]
pub struct Selector {
    root: Node,
    nodes: usize,
}

impl Selector {
    pub fn parse(text: &str) -> Result<Selector, Invalid> {
        if text.len() > MAX_TEXT {
            return Err(Invalid("selector longer than 4 KiB"));
        }
        let toks = lex(text)?;
        let mut p = Parser { toks, at: 0, nodes: 0, depth: 0 };
        let root = p.or()?;
        if p.at != p.toks.len() {
            return Err(Invalid("selector syntax error"));
        }
        Ok(Selector { root, nodes: p.nodes })
    }

    /// How many syntax-tree nodes it has (at most [`MAX_NODES`]).
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// True only when the selector is true for the message (not false, not unknown).
    pub fn matches(&self, msg: &dyn Lookup) -> bool {
        truth(&self.root, msg) == Some(true)
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Kw(Kw),
    Str(String),
    Int(i64),
    Float(f64),
    Op(&'static str),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kw {
    And,
    Or,
    Not,
    In,
    Like,
    Escape,
    Between,
    Is,
    Null,
    True,
    False,
}

fn lex(text: &str) -> Result<Vec<Tok>, Invalid> {
    let b = text.as_bytes();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if toks.len() > MAX_NODES * 4 {
            return Err(Invalid("selector too complex"));
        }
        if c == b'\'' {
            let mut s = String::new();
            let mut j = i + 1;
            loop {
                match text[j..].find('\'') {
                    None => return Err(Invalid("selector has an unterminated string")),
                    Some(k) => {
                        s.push_str(&text[j..j + k]);
                        j += k + 1;
                        if b.get(j) == Some(&b'\'') {
                            s.push('\'');
                            j += 1;
                        } else {
                            break;
                        }
                    }
                }
            }
            toks.push(Tok::Str(s));
            i = j;
        } else if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            let start = i;
            let mut float = false;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if i < b.len() && b[i] == b'.' {
                float = true;
                i += 1;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
            }
            if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
                float = true;
                i += 1;
                if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
                    i += 1;
                }
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
            }
            let lit = &text[start..i];
            toks.push(if float {
                Tok::Float(lit.parse().ok().filter(|f: &f64| f.is_finite()).ok_or(Invalid("selector has a bad number"))?)
            } else {
                Tok::Int(lit.parse().map_err(|_| Invalid("selector has a bad number"))?)
            });
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b'$' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'_' | b'$' | b'.')) {
                i += 1;
            }
            let word = &text[start..i];
            let kw = match word.to_ascii_uppercase().as_str() {
                "AND" => Some(Kw::And),
                "OR" => Some(Kw::Or),
                "NOT" => Some(Kw::Not),
                "IN" => Some(Kw::In),
                "LIKE" => Some(Kw::Like),
                "ESCAPE" => Some(Kw::Escape),
                "BETWEEN" => Some(Kw::Between),
                "IS" => Some(Kw::Is),
                "NULL" => Some(Kw::Null),
                "TRUE" => Some(Kw::True),
                "FALSE" => Some(Kw::False),
                _ => None,
            };
            toks.push(kw.map_or_else(|| Tok::Ident(word.to_string()), Tok::Kw));
        } else {
            let two = b.get(i..i + 2);
            let op = match two {
                Some(b"<>") => "<>",
                Some(b"<=") => "<=",
                Some(b">=") => ">=",
                _ => match c {
                    b'=' => "=",
                    b'<' => "<",
                    b'>' => ">",
                    b'+' => "+",
                    b'-' => "-",
                    b'*' => "*",
                    b'/' => "/",
                    b'(' => "(",
                    b')' => ")",
                    b',' => ",",
                    _ => return Err(Invalid("selector has an unexpected character")),
                },
            };
            i += op.len();
            toks.push(Tok::Op(op));
        }
    }
    Ok(toks)
}

struct Parser {
    toks: Vec<Tok>,
    at: usize,
    nodes: usize,
    depth: usize,
}

impl Parser {
    fn node(&mut self, n: Node) -> Result<Box<Node>, Invalid> {
        self.count(1)?;
        Ok(Box::new(n))
    }

    fn count(&mut self, n: usize) -> Result<(), Invalid> {
        self.nodes += n;
        if self.nodes > MAX_NODES {
            return Err(Invalid("selector has more than 64 nodes"));
        }
        Ok(())
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }

    fn eat_kw(&mut self, kw: Kw) -> bool {
        if self.peek() == Some(&Tok::Kw(kw)) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn eat_op(&mut self, op: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Op(o)) if *o == op) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn expect_op(&mut self, op: &str) -> Result<(), Invalid> {
        if self.eat_op(op) {
            Ok(())
        } else {
            Err(Invalid("selector syntax error"))
        }
    }

    fn deeper(&mut self) -> Result<(), Invalid> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Invalid("selector nested too deeply"));
        }
        Ok(())
    }

    fn or(&mut self) -> Result<Node, Invalid> {
        let mut l = self.and()?;
        while self.eat_kw(Kw::Or) {
            let r = self.and()?;
            l = *self.node(Node::Or(Box::new(l), Box::new(r)))?;
        }
        Ok(l)
    }

    fn and(&mut self) -> Result<Node, Invalid> {
        let mut l = self.not()?;
        while self.eat_kw(Kw::And) {
            let r = self.not()?;
            l = *self.node(Node::And(Box::new(l), Box::new(r)))?;
        }
        Ok(l)
    }

    fn not(&mut self) -> Result<Node, Invalid> {
        if self.eat_kw(Kw::Not) {
            self.deeper()?;
            let e = self.not()?;
            self.depth -= 1;
            return Ok(*self.node(Node::Not(Box::new(e)))?);
        }
        self.comparison()
    }

    fn comparison(&mut self) -> Result<Node, Invalid> {
        let e = self.sum()?;
        let cmp = match self.peek() {
            Some(Tok::Op("=")) => Some(Cmp::Eq),
            Some(Tok::Op("<>")) => Some(Cmp::Ne),
            Some(Tok::Op("<")) => Some(Cmp::Lt),
            Some(Tok::Op(">")) => Some(Cmp::Gt),
            Some(Tok::Op("<=")) => Some(Cmp::Le),
            Some(Tok::Op(">=")) => Some(Cmp::Ge),
            _ => None,
        };
        if let Some(cmp) = cmp {
            self.at += 1;
            let r = self.sum()?;
            return Ok(*self.node(Node::Cmp(cmp, Box::new(e), Box::new(r)))?);
        }
        if self.eat_kw(Kw::Is) {
            let neg = self.eat_kw(Kw::Not);
            if !self.eat_kw(Kw::Null) {
                return Err(Invalid("selector syntax error"));
            }
            return Ok(*self.node(Node::IsNull { e: Box::new(e), neg })?);
        }
        let neg = self.eat_kw(Kw::Not);
        if self.eat_kw(Kw::Between) {
            let lo = self.sum()?;
            if !self.eat_kw(Kw::And) {
                return Err(Invalid("selector syntax error"));
            }
            let hi = self.sum()?;
            return Ok(*self.node(Node::Between { e: Box::new(e), lo: Box::new(lo), hi: Box::new(hi), neg })?);
        }
        if self.eat_kw(Kw::In) {
            self.expect_op("(")?;
            let mut list = Vec::new();
            loop {
                match self.toks.get(self.at) {
                    Some(Tok::Str(s)) => list.push(s.clone()),
                    _ => return Err(Invalid("selector IN takes string literals")),
                }
                self.at += 1;
                self.count(1)?;
                if !self.eat_op(",") {
                    break;
                }
            }
            self.expect_op(")")?;
            return Ok(*self.node(Node::In { e: Box::new(e), list, neg })?);
        }
        if self.eat_kw(Kw::Like) {
            let Some(Tok::Str(p)) = self.toks.get(self.at).cloned() else { return Err(Invalid("selector LIKE takes a string literal")) };
            self.at += 1;
            let escape = if self.eat_kw(Kw::Escape) {
                let Some(Tok::Str(esc)) = self.toks.get(self.at).cloned() else { return Err(Invalid("selector ESCAPE takes one character")) };
                self.at += 1;
                let mut cs = esc.chars();
                match (cs.next(), cs.next()) {
                    (Some(c), None) => Some(c),
                    _ => return Err(Invalid("selector ESCAPE takes one character")),
                }
            } else {
                None
            };
            let pattern = like_pattern(&p, escape)?;
            return Ok(*self.node(Node::Like { e: Box::new(e), pattern, neg })?);
        }
        if neg {
            return Err(Invalid("selector syntax error"));
        }
        Ok(e)
    }

    fn sum(&mut self) -> Result<Node, Invalid> {
        let mut l = self.product()?;
        loop {
            let op = if self.eat_op("+") {
                Arith::Add
            } else if self.eat_op("-") {
                Arith::Sub
            } else {
                return Ok(l);
            };
            let r = self.product()?;
            l = *self.node(Node::Arith(op, Box::new(l), Box::new(r)))?;
        }
    }

    fn product(&mut self) -> Result<Node, Invalid> {
        let mut l = self.unary()?;
        loop {
            let op = if self.eat_op("*") {
                Arith::Mul
            } else if self.eat_op("/") {
                Arith::Div
            } else {
                return Ok(l);
            };
            let r = self.unary()?;
            l = *self.node(Node::Arith(op, Box::new(l), Box::new(r)))?;
        }
    }

    fn unary(&mut self) -> Result<Node, Invalid> {
        if self.eat_op("-") {
            self.deeper()?;
            let e = self.unary()?;
            self.depth -= 1;
            return Ok(*self.node(Node::Neg(Box::new(e)))?);
        }
        if self.eat_op("+") {
            self.deeper()?;
            let e = self.unary()?;
            self.depth -= 1;
            return Ok(e);
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Node, Invalid> {
        let Some(tok) = self.toks.get(self.at).cloned() else { return Err(Invalid("selector ends too early")) };
        self.at += 1;
        let n = match tok {
            Tok::Op("(") => {
                self.deeper()?;
                let e = self.or()?;
                self.depth -= 1;
                self.expect_op(")")?;
                return Ok(e);
            }
            Tok::Ident(name) => Node::Ident(name),
            Tok::Str(s) => Node::Lit(Val::Str(s)),
            Tok::Int(n) => Node::Lit(Val::Int(n)),
            Tok::Float(f) => Node::Lit(Val::Float(f)),
            Tok::Kw(Kw::True) => Node::Lit(Val::Bool(true)),
            Tok::Kw(Kw::False) => Node::Lit(Val::Bool(false)),
            _ => return Err(Invalid("selector syntax error")),
        };
        Ok(*self.node(n)?)
    }
}

fn like_pattern(p: &str, escape: Option<char>) -> Result<Vec<Pat>, Invalid> {
    let mut out = Vec::new();
    let mut cs = p.chars();
    while let Some(c) = cs.next() {
        out.push(match c {
            c if Some(c) == escape => match cs.next() {
                Some(n) => Pat::Char(n),
                None => return Err(Invalid("selector LIKE pattern ends with its escape")),
            },
            '%' => Pat::Any,
            '_' => Pat::One,
            c => Pat::Char(c),
        });
    }
    Ok(out)
}

/// Wildcard match, iterative: remembers the last `%` and retries from there (O(n·m), no
/// recursion).
fn like(s: &str, p: &[Pat]) -> bool {
    let s: Vec<char> = s.chars().collect();
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        match p.get(j) {
            Some(Pat::Any) => {
                star = Some((j, i));
                j += 1;
            }
            Some(Pat::One) => {
                i += 1;
                j += 1;
            }
            Some(Pat::Char(c)) if *c == s[i] => {
                i += 1;
                j += 1;
            }
            _ => match star {
                Some((sj, si)) => {
                    j = sj + 1;
                    i = si + 1;
                    star = Some((sj, si + 1));
                }
                None => return false,
            },
        }
    }
    p[j..].iter().all(|x| *x == Pat::Any)
}

/// A node's value; `None` is SQL's NULL (a missing property, or an unknown result).
fn value(n: &Node, m: &dyn Lookup) -> Option<Val> {
    match n {
        Node::Lit(v) => Some(v.clone()),
        Node::Ident(name) => m.lookup(name),
        Node::Neg(e) => match num(value(e, m)?)? {
            Val::Int(i) => i.checked_neg().map(Val::Int),
            Val::Float(f) => Some(Val::Float(-f)),
            _ => None,
        },
        Node::Arith(op, l, r) => arith(*op, num(value(l, m)?)?, num(value(r, m)?)?),
        _ => truth(n, m).map(Val::Bool),
    }
}

/// A value as a number: numbers as they are, text that reads as one; else None.
fn num(v: Val) -> Option<Val> {
    match v {
        Val::Int(_) | Val::Float(_) => Some(v),
        Val::Str(s) => {
            let t = s.trim();
            t.parse::<i64>().map(Val::Int).ok().or_else(|| t.parse::<f64>().ok().filter(|f| f.is_finite()).map(Val::Float))
        }
        Val::Bool(_) => None,
    }
}

fn as_f64(v: &Val) -> f64 {
    match v {
        Val::Int(i) => *i as f64,
        Val::Float(f) => *f,
        _ => f64::NAN,
    }
}

fn arith(op: Arith, l: Val, r: Val) -> Option<Val> {
    if let (Val::Int(a), Val::Int(b)) = (&l, &r) {
        let (a, b) = (*a, *b);
        return match op {
            Arith::Add => a.checked_add(b),
            Arith::Sub => a.checked_sub(b),
            Arith::Mul => a.checked_mul(b),
            Arith::Div => a.checked_div(b),
        }
        .map(Val::Int);
    }
    let (a, b) = (as_f64(&l), as_f64(&r));
    let f = match op {
        Arith::Add => a + b,
        Arith::Sub => a - b,
        Arith::Mul => a * b,
        Arith::Div => a / b,
    };
    f.is_finite().then_some(Val::Float(f))
}

/// Compares two values: numbers with numbers (text read as a number next to one), text with
/// text, booleans with booleans (text `true`/`false` next to one, `=`/`<>` only); else unknown.
fn compare(op: Cmp, l: Val, r: Val) -> Option<bool> {
    use std::cmp::Ordering;
    let ord = match (l, r) {
        (Val::Str(a), Val::Str(b)) => a.cmp(&b),
        (Val::Bool(a), b) | (b, Val::Bool(a)) => {
            let b = match b {
                Val::Bool(b) => b,
                Val::Str(s) if s.eq_ignore_ascii_case("true") => true,
                Val::Str(s) if s.eq_ignore_ascii_case("false") => false,
                _ => return None,
            };
            return match op {
                Cmp::Eq => Some(a == b),
                Cmp::Ne => Some(a != b),
                _ => None,
            };
        }
        (a, b) => {
            let (a, b) = (num(a)?, num(b)?);
            match (&a, &b) {
                (Val::Int(x), Val::Int(y)) => x.cmp(y),
                _ => as_f64(&a).partial_cmp(&as_f64(&b))?,
            }
        }
    };
    Some(match op {
        Cmp::Eq => ord == Ordering::Equal,
        Cmp::Ne => ord != Ordering::Equal,
        Cmp::Lt => ord == Ordering::Less,
        Cmp::Gt => ord == Ordering::Greater,
        Cmp::Le => ord != Ordering::Greater,
        Cmp::Ge => ord != Ordering::Less,
    })
}

fn text(v: Val) -> Option<String> {
    match v {
        Val::Str(s) => Some(s),
        _ => None,
    }
}

/// A node's truth: Some(true), Some(false), or None (unknown).
fn truth(n: &Node, m: &dyn Lookup) -> Option<bool> {
    let neg = |b: Option<bool>, neg: bool| b.map(|b| b != neg);
    match n {
        Node::And(l, r) => match (truth(l, m), truth(r, m)) {
            (Some(false), _) | (_, Some(false)) => Some(false),
            (Some(true), Some(true)) => Some(true),
            _ => None,
        },
        Node::Or(l, r) => match (truth(l, m), truth(r, m)) {
            (Some(true), _) | (_, Some(true)) => Some(true),
            (Some(false), Some(false)) => Some(false),
            _ => None,
        },
        Node::Not(e) => truth(e, m).map(|b| !b),
        Node::Cmp(op, l, r) => compare(*op, value(l, m)?, value(r, m)?),
        Node::Between { e, lo, hi, neg: n } => {
            let v = value(e, m)?;
            let ge = compare(Cmp::Ge, v.clone(), value(lo, m)?);
            let le = compare(Cmp::Le, v, value(hi, m)?);
            let both = match (ge, le) {
                (Some(false), _) | (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            };
            neg(both, *n)
        }
        Node::In { e, list, neg: n } => {
            let v = text(value(e, m)?)?;
            neg(Some(list.contains(&v)), *n)
        }
        Node::Like { e, pattern, neg: n } => {
            let v = text(value(e, m)?)?;
            neg(Some(like(&v, pattern)), *n)
        }
        Node::IsNull { e, neg: n } => Some(value(e, m).is_none() != *n),
        Node::Ident(_) | Node::Lit(_) => match value(n, m)? {
            Val::Bool(b) => Some(b),
            Val::Str(s) if s.eq_ignore_ascii_case("true") => Some(true),
            Val::Str(s) if s.eq_ignore_ascii_case("false") => Some(false),
            _ => None,
        },
        Node::Neg(_) | Node::Arith(..) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    struct Props(&'static [(&'static str, &'static str)]);

    impl Lookup for Props {
        fn lookup(&self, name: &str) -> Option<Val> {
            self.0.iter().find(|(k, _)| *k == name).map(|(_, v)| Val::Str((*v).to_string()))
        }
    }

    const MSG: Props = Props(&[("color", "blue"), ("size", "12"), ("price", "9.5"), ("flag", "true"), ("name", "50%_off")]);

    fn sel(s: &str) -> bool {
        Selector::parse(s).unwrap_or_else(|e| panic!("{s}: {e:?}")).matches(&MSG)
    }

    #[test]
    fn comparisons_logic_and_arithmetic() {
        for s in [
            "color = 'blue'",
            "color <> 'red'",
            "size > 10 AND size <= 12",
            "size + 1 = 13",
            "size * 2 - 4 = 20",
            "size / 5 = 2",
            "price < 10.0",
            "price >= 9.5",
            "-size < 0",
            "flag = TRUE",
            "flag",
            "NOT color = 'red'",
            "color = 'red' OR size = 12",
            "(color = 'red' OR color = 'blue') AND NOT (size < 3)",
            "size BETWEEN 10 AND 20",
            "size NOT BETWEEN 13 AND 20",
            "color IN ('red', 'blue')",
            "color NOT IN ('red', 'green')",
            "color LIKE 'bl%'",
            "color LIKE '_lue'",
            "color NOT LIKE 'r%'",
            "name LIKE '50!%!_%' ESCAPE '!'",
            "missing IS NULL",
            "color IS NOT NULL",
            "color = 'it''s' OR TRUE",
            "2e1 > size",
            "color = 'blue' and size = 12",
        ] {
            assert!(sel(s), "{s}");
        }
        for s in [
            "color = 'red'",
            "size > 12",
            "name LIKE '50!%x%' ESCAPE '!'",
            "color NOT IN ('blue')",
            "color = 5",
            "flag = FALSE",
            "size BETWEEN 1 AND 5",
            "color IS NULL",
        ] {
            assert!(!sel(s), "{s}");
        }
    }

    #[test]
    fn unknown_is_neither_true_nor_false() {
        // A missing property: the comparison is unknown, so is its NOT; OR with true is true,
        // AND with false is false.
        for s in ["missing = 1", "NOT missing = 1", "missing > 1 AND TRUE", "missing IN ('a')", "missing LIKE '%'", "color + 1 = 2", "size / 0 = 1"] {
            assert!(!sel(s), "{s}");
        }
        assert!(sel("missing = 1 OR TRUE"));
        assert!(sel("NOT (missing = 1 AND FALSE)"));
    }

    #[test]
    fn bad_and_oversized_selectors_are_refused() {
        for s in [
            "",
            "color =",
            "color = 'x",
            "a ==",
            "a IN (1)",
            "a LIKE b",
            "(a = 1",
            "a = 1)",
            "a = 99999999999999999999",
            "a # 1",
            "a NOT 1",
            "a LIKE 'x!' ESCAPE '!'",
            "a IS 1",
        ] {
            assert!(Selector::parse(s).is_err(), "{s}");
        }
        assert_eq!(Selector::parse(&format!("a = '{}'", "x".repeat(MAX_TEXT))), Err(Invalid("selector longer than 4 KiB")));
        let many = (0..40).map(|i| format!("a = {i}")).collect::<Vec<_>>().join(" OR ");
        assert_eq!(Selector::parse(&many), Err(Invalid("selector has more than 64 nodes")));
        let deep = format!("{}a = 1{}", "(".repeat(40), ")".repeat(40));
        assert_eq!(Selector::parse(&deep), Err(Invalid("selector nested too deeply")));
        assert!(Selector::parse(&"NOT ".repeat(1000)).is_err());
        assert!(Selector::parse(&"-".repeat(3000)).is_err());
        assert!(Selector::parse(&format!("{}1", "- ".repeat(100))).is_err());
    }

    #[test]
    fn like_has_no_exponential_backtracking() {
        let p = like_pattern(&"%a".repeat(30), None).unwrap();
        assert!(!like(&"a".repeat(29), &p));
        assert!(like(&"a".repeat(30), &p));
    }

    proptest! {
        #[test]
        fn random_input_never_panics_and_stays_within_the_node_limit(s in "[a-z0-9 ()'=<>+*/%_,.-]{0,300}|(NOT |AND |OR |\\(|\\)|a |1 |'x' |= |IN |LIKE |BETWEEN |IS |NULL ){0,200}") {
            if let Ok(sel) = Selector::parse(&s) {
                prop_assert!(sel.nodes() <= MAX_NODES);
                let _ = sel.matches(&MSG);
            }
        }
    }
}
