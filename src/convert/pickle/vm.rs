//! The pickle machine: reads opcodes, keeps the stack and memo, calls nothing.

use std::collections::HashMap;
use std::path::Path;

use super::calls;
use super::globals::{self, Allowed};
use super::text;
use super::value::{StorageRef, Value};
use crate::convert::ConvertError;

/// Index of a node in the machine's arena.
pub(super) type Id = usize;

/// Deepest value nesting accepted.
pub(super) const MAX_DEPTH: u32 = 256;

/// A node of the object graph while it is being built. Containers refer to other nodes by
/// id so that memoised objects mutated later (`EMPTY_DICT; BINPUT; ...; SETITEMS`) are seen
/// with their final contents wherever they are referenced.
#[derive(Debug)]
pub(super) enum Node {
    /// A finished value without children in the arena.
    Leaf(Value),
    /// `list`.
    List(Vec<Id>),
    /// `tuple`.
    Tuple(Vec<Id>),
    /// `set` / `frozenset`.
    Set(Vec<Id>),
    /// `dict` with an index of hashable keys to their position.
    Dict(Vec<(Id, Id)>, HashMap<HashKey, usize>),
    /// A `numpy.dtype(descr)` waiting for its `BUILD` state.
    NpDType {
        /// Type string such as `f4`, prefixed with `<` or `>` once the state gives a byte order.
        descr: String,
    },
    /// A `numpy.core.multiarray._reconstruct(...)` waiting for its `BUILD` state.
    NpPending,
}

/// A hashable image of a dict key, used to replace values of repeated keys like Python does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum HashKey {
    None,
    Int(i64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<HashKey>),
}

/// The running machine.
pub(super) struct Machine<'a> {
    pub(super) data: &'a [u8],
    pub(super) pos: usize,
    pub(super) file: &'a Path,
    pub(super) nodes: Vec<Node>,
    stack: Vec<Id>,
    marks: Vec<usize>,
    memo: HashMap<u32, Id>,
    /// Bytes of expanded values still allowed; shared references can make the expanded tree
    /// much larger than the pickle, so expansion is metered.
    pub(super) budget: u64,
    pub(super) budget_limit: u64,
    /// Every storage a persistent id named, the first of each key, in order (a key named
    /// again costs no memory: a pickle can name one at every 3 bytes).
    pub(super) loaded: Vec<StorageRef>,
    loaded_keys: std::collections::HashSet<String>,
}

impl<'a> Machine<'a> {
    pub(super) fn new(data: &'a [u8], file: &'a Path) -> Self {
        // Shared references expand to copies, bounded as any repetition of a source's bytes.
        let budget_limit = crate::convert::limits::expansion_cap(data.len() as u64);
        Machine {
            data,
            pos: 0,
            file,
            nodes: Vec::new(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
            budget: budget_limit,
            budget_limit,
            loaded: Vec::new(),
            loaded_keys: std::collections::HashSet::new(),
        }
    }

    pub(super) fn malformed(&self, at: usize, reason: impl Into<String>) -> ConvertError {
        ConvertError::malformed(self.file, "pickle", at, reason)
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ConvertError> {
        let data = self.data;
        let slice = self
            .pos
            .checked_add(n)
            .and_then(|end| data.get(self.pos..end))
            .ok_or_else(|| {
                ConvertError::truncated(
                    self.file,
                    format!("pickle {what}"),
                    self.pos,
                    n,
                    data.len(),
                )
            })?;
        self.pos += n;
        Ok(slice)
    }

    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ConvertError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    /// A length prefix of `N` bytes, checked against the remaining input.
    fn len_prefix<const N: usize>(&mut self, what: &str) -> Result<usize, ConvertError> {
        let start = self.pos;
        let raw = self.arr::<N>(what)?;
        let mut wide = [0u8; 8];
        wide.get_mut(..N).unwrap_or(&mut []).copy_from_slice(&raw);
        let n = u64::from_le_bytes(wide);
        let remaining = self.data.len().saturating_sub(self.pos);
        match usize::try_from(n) {
            Ok(n) if n <= remaining => Ok(n),
            _ => Err(ConvertError::Truncated {
                file: self.file.to_path_buf(),
                what: format!("pickle {what}"),
                offset: start as u64,
                needed: n,
                len: self.data.len() as u64,
            }),
        }
    }

    /// A newline-terminated argument of a text opcode, without the newline.
    fn line(&mut self, what: &str) -> Result<&'a [u8], ConvertError> {
        let data = self.data;
        let rest = data.get(self.pos..).unwrap_or(&[]);
        let n = rest.iter().position(|&b| b == b'\n').ok_or_else(|| {
            ConvertError::truncated(
                self.file,
                format!("pickle {what} line"),
                self.pos,
                rest.len() + 1,
                data.len(),
            )
        })?;
        let line = rest.get(..n).unwrap_or(&[]);
        self.pos += n + 1;
        Ok(line)
    }

    fn line_str(&mut self, what: &str) -> Result<&'a str, ConvertError> {
        let at = self.pos;
        let line = self.line(what)?;
        std::str::from_utf8(line).map_err(|_| self.malformed(at, format!("{what} is not UTF-8")))
    }

    pub(super) fn push_node(&mut self, node: Node) -> Id {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    fn push(&mut self, node: Node) {
        let id = self.push_node(node);
        self.stack.push(id);
    }

    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self, at: usize) -> Result<Id, ConvertError> {
        if self.stack.len() <= self.floor() {
            return Err(self.malformed(at, "stack underflow"));
        }
        self.stack
            .pop()
            .ok_or_else(|| self.malformed(at, "stack underflow"))
    }

    fn top(&self, at: usize) -> Result<Id, ConvertError> {
        if self.stack.len() <= self.floor() {
            return Err(self.malformed(at, "stack underflow"));
        }
        self.stack
            .last()
            .copied()
            .ok_or_else(|| self.malformed(at, "stack underflow"))
    }

    fn pop_mark(&mut self, at: usize) -> Result<Vec<Id>, ConvertError> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| self.malformed(at, "no MARK on the stack"))?;
        if mark > self.stack.len() {
            return Err(self.malformed(at, "MARK above the stack"));
        }
        Ok(self.stack.split_off(mark))
    }

    fn node_mut(&mut self, id: Id, at: usize) -> Result<&mut Node, ConvertError> {
        let file = self.file;
        self.nodes
            .get_mut(id)
            .ok_or_else(|| ConvertError::malformed(file, "pickle", at, "dangling reference"))
    }

    fn memo_put(&mut self, idx: u32, at: usize) -> Result<(), ConvertError> {
        let id = self.top(at)?;
        self.memo.insert(idx, id);
        Ok(())
    }

    fn memo_get(&mut self, idx: u32, at: usize) -> Result<(), ConvertError> {
        let id = *self
            .memo
            .get(&idx)
            .ok_or_else(|| self.malformed(at, format!("memo key {idx} was never stored")))?;
        self.stack.push(id);
        Ok(())
    }

    fn check_global(&self, module: &str, name: &str) -> Result<Allowed, ConvertError> {
        globals::lookup(module, name).ok_or_else(|| ConvertError::RefusedGlobal {
            file: self.file.to_path_buf(),
            module: module.to_string(),
            name: name.to_string(),
        })
    }

    fn push_global(&mut self, module: &str, name: &str) -> Result<(), ConvertError> {
        self.check_global(module, name)?;
        self.push(Node::Leaf(Value::Global {
            module: module.to_string(),
            name: name.to_string(),
        }));
        Ok(())
    }

    fn refuse(&self, opcode: &'static str, at: usize, reason: &'static str) -> ConvertError {
        ConvertError::UnsupportedOpcode {
            file: self.file.to_path_buf(),
            opcode,
            offset: at as u64,
            reason,
        }
    }

    fn append(&mut self, target: Id, items: Vec<Id>, at: usize) -> Result<(), ConvertError> {
        match self.node_mut(target, at)? {
            Node::List(list) => {
                list.extend(items);
                Ok(())
            }
            _ => Err(self.malformed(at, "APPEND to something that is not a list")),
        }
    }

    pub(super) fn set_items(
        &mut self,
        target: Id,
        items: Vec<Id>,
        at: usize,
    ) -> Result<(), ConvertError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.malformed(at, "SETITEMS with an odd number of items"));
        }
        let mut keys: Vec<Option<HashKey>> = Vec::with_capacity(items.len() / 2);
        for &k in items.iter().step_by(2) {
            let mut cost = 0u64;
            let key = self.hash_key(k, 0, &mut cost);
            self.charge(cost)?;
            keys.push(key);
        }
        let Node::Dict(entries, index) = self.node_mut(target, at)? else {
            return Err(self.malformed(at, "SETITEM on something that is not a dict"));
        };
        for (pair, key) in items.chunks_exact(2).zip(keys) {
            let (&k, &v) = match pair {
                [k, v] => (k, v),
                _ => continue,
            };
            match key {
                Some(key) => match index.get(&key) {
                    Some(&i) => {
                        if let Some(slot) = entries.get_mut(i) {
                            slot.1 = v;
                        }
                    }
                    None => {
                        index.insert(key, entries.len());
                        entries.push((k, v));
                    }
                },
                None => entries.push((k, v)),
            }
        }
        Ok(())
    }

    /// The hashable image of a key, or `None` for keys Python could not hash or that are
    /// too large to compare (these are appended without replacing earlier equal keys).
    /// `cost` accumulates the bytes copied, which the caller charges to the budget.
    fn hash_key(&self, id: Id, depth: u32, cost: &mut u64) -> Option<HashKey> {
        /// Bytes of one key image beyond which keys are not compared.
        const MAX_KEY_COST: u64 = 1 << 16;
        *cost += 16;
        if depth > MAX_DEPTH || *cost > MAX_KEY_COST {
            return None;
        }
        if let Some(Node::Leaf(Value::Str(s))) = self.nodes.get(id) {
            *cost += s.len() as u64;
        }
        if let Some(Node::Leaf(Value::Bytes(b))) = self.nodes.get(id) {
            *cost += b.len() as u64;
        }
        if *cost > MAX_KEY_COST {
            return None;
        }
        match self.nodes.get(id)? {
            Node::Leaf(Value::None) => Some(HashKey::None),
            Node::Leaf(Value::Bool(b)) => Some(HashKey::Int(i64::from(*b))),
            Node::Leaf(Value::Int(i)) => Some(HashKey::Int(*i)),
            Node::Leaf(Value::Str(s)) => Some(HashKey::Str(s.clone())),
            Node::Leaf(Value::Bytes(b)) => Some(HashKey::Bytes(b.clone())),
            Node::Tuple(items) => items
                .iter()
                .map(|&i| self.hash_key(i, depth + 1, cost))
                .collect::<Option<Vec<_>>>()
                .map(HashKey::Tuple),
            _ => None,
        }
    }

    pub(super) fn charge(&mut self, cost: u64) -> Result<(), ConvertError> {
        self.budget = self
            .budget
            .checked_sub(cost)
            .ok_or(ConvertError::PickleTooComplex {
                file: self.file.to_path_buf(),
                what: "expanded size in bytes",
                limit: self.budget_limit,
            })?;
        Ok(())
    }

    /// Copies a node out of the arena as an owned [`Value`], metering the expansion and
    /// refusing cycles (which show up as excessive depth).
    pub(super) fn expand(&mut self, id: Id, depth: u32) -> Result<Value, ConvertError> {
        if depth > MAX_DEPTH {
            return Err(ConvertError::PickleTooComplex {
                file: self.file.to_path_buf(),
                what: "nesting depth",
                limit: u64::from(MAX_DEPTH),
            });
        }
        self.charge(16)?;
        let node = self
            .nodes
            .get(id)
            .ok_or_else(|| self.malformed(self.pos, "dangling reference"))?;
        enum Shape {
            List(Vec<Id>),
            Tuple(Vec<Id>),
            Set(Vec<Id>),
            Dict(Vec<(Id, Id)>),
        }
        let shape = match node {
            Node::Leaf(v) => {
                let cost = leaf_cost(v);
                let v = v.clone();
                self.charge(cost)?;
                return Ok(v);
            }
            Node::NpDType { descr, .. } => {
                return Ok(Value::Global {
                    module: "numpy".into(),
                    name: format!("dtype({descr})"),
                })
            }
            Node::NpPending => {
                return Err(self.malformed(self.pos, "numpy array without BUILD state"))
            }
            Node::List(items) => Shape::List(items.clone()),
            Node::Tuple(items) => Shape::Tuple(items.clone()),
            Node::Set(items) => Shape::Set(items.clone()),
            Node::Dict(items, _) => Shape::Dict(items.clone()),
        };
        // Each element built takes a `Value`'s size besides what its leaves hold: charged at
        // that size (not 8 bytes), so the budget bounds the memory a memo bomb would build.
        let slot = std::mem::size_of::<Value>() as u64;
        let all = |m: &mut Self, ids: Vec<Id>| -> Result<Vec<Value>, ConvertError> {
            m.charge(ids.len() as u64 * slot)?;
            ids.into_iter().map(|i| m.expand(i, depth + 1)).collect()
        };
        Ok(match shape {
            Shape::List(ids) => Value::List(all(self, ids)?),
            Shape::Tuple(ids) => Value::Tuple(all(self, ids)?),
            Shape::Set(ids) => Value::Set(all(self, ids)?),
            Shape::Dict(pairs) => {
                self.charge(pairs.len() as u64 * 2 * slot)?;
                let mut out = Vec::with_capacity(pairs.len());
                for (k, v) in pairs {
                    out.push((self.expand(k, depth + 1)?, self.expand(v, depth + 1)?));
                }
                Value::Dict(out)
            }
        })
    }

    /// Runs until `STOP`; returns the value on top of the stack.
    pub(super) fn run(&mut self) -> Result<Value, ConvertError> {
        loop {
            let at = self.pos;
            let op = self.arr::<1>("opcode")?[0];
            match op {
                // STOP
                b'.' => {
                    let id = self.pop(at)?;
                    return self.expand(id, 0);
                }
                // PROTO
                0x80 => {
                    let v = self.arr::<1>("protocol")?[0];
                    if v > 5 {
                        return Err(
                            self.malformed(at, format!("pickle protocol {v} is newer than 5"))
                        );
                    }
                }
                // FRAME: frames only group opcodes; the content follows inline.
                0x95 => {
                    self.len_prefix::<8>("frame")?;
                }
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    if self.stack.len() > self.floor() {
                        self.pop(at)?;
                    } else {
                        self.pop_mark(at)?;
                    }
                }
                b'1' => {
                    self.pop_mark(at)?;
                }
                b'2' => {
                    let id = self.top(at)?;
                    self.stack.push(id);
                }
                b'N' => self.push(Node::Leaf(Value::None)),
                0x88 => self.push(Node::Leaf(Value::Bool(true))),
                0x89 => self.push(Node::Leaf(Value::Bool(false))),
                b'I' => {
                    let s = self.line_str("INT")?;
                    let v = match s {
                        "01" => Value::Bool(true),
                        "00" => Value::Bool(false),
                        _ => text::parse_int(s).ok_or_else(|| self.malformed(at, "bad INT"))?,
                    };
                    self.push(Node::Leaf(v));
                }
                b'J' => {
                    let v = i32::from_le_bytes(self.arr("BININT")?);
                    self.push(Node::Leaf(Value::Int(i64::from(v))));
                }
                b'K' => {
                    let v = self.arr::<1>("BININT1")?[0];
                    self.push(Node::Leaf(Value::Int(i64::from(v))));
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.arr("BININT2")?);
                    self.push(Node::Leaf(Value::Int(i64::from(v))));
                }
                b'L' => {
                    let s = self.line_str("LONG")?;
                    let v = text::parse_int(s.strip_suffix('L').unwrap_or(s))
                        .ok_or_else(|| self.malformed(at, "bad LONG"))?;
                    self.push(Node::Leaf(v));
                }
                0x8a => {
                    let n = self.len_prefix::<1>("LONG1")?;
                    let bytes = self.take(n, "LONG1")?;
                    self.push(Node::Leaf(text::long_from_le(bytes)));
                }
                0x8b => {
                    let n = self.len_prefix::<4>("LONG4")?;
                    let bytes = self.take(n, "LONG4")?;
                    self.push(Node::Leaf(text::long_from_le(bytes)));
                }
                b'F' => {
                    let s = self.line_str("FLOAT")?;
                    let v: f64 = s
                        .trim()
                        .parse()
                        .map_err(|_| self.malformed(at, "bad FLOAT"))?;
                    self.push(Node::Leaf(Value::Float(v)));
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.arr("BINFLOAT")?);
                    self.push(Node::Leaf(Value::Float(v)));
                }
                b'S' => {
                    let line = self.line("STRING")?;
                    let bytes = text::unquote(line)
                        .ok_or_else(|| self.malformed(at, "bad STRING literal"))?;
                    self.push(Node::Leaf(text::str_or_bytes(bytes)));
                }
                b'T' | b'U' => {
                    let n = if op == b'T' {
                        self.len_prefix::<4>("BINSTRING")?
                    } else {
                        self.len_prefix::<1>("SHORT_BINSTRING")?
                    };
                    let bytes = self.take(n, "string")?.to_vec();
                    self.push(Node::Leaf(text::str_or_bytes(bytes)));
                }
                b'V' => {
                    let line = self.line("UNICODE")?;
                    let s = text::raw_unicode_escape(line)
                        .ok_or_else(|| self.malformed(at, "bad UNICODE literal"))?;
                    self.push(Node::Leaf(Value::Str(s)));
                }
                b'X' | 0x8c | 0x8d => {
                    let n = match op {
                        b'X' => self.len_prefix::<4>("BINUNICODE")?,
                        0x8c => self.len_prefix::<1>("SHORT_BINUNICODE")?,
                        _ => self.len_prefix::<8>("BINUNICODE8")?,
                    };
                    let bytes = self.take(n, "unicode")?;
                    let s = std::str::from_utf8(bytes)
                        .map_err(|_| self.malformed(at, "string is not UTF-8"))?;
                    self.push(Node::Leaf(Value::Str(s.to_string())));
                }
                b'B' | b'C' | 0x8e | 0x96 => {
                    let n = match op {
                        b'B' => self.len_prefix::<4>("BINBYTES")?,
                        b'C' => self.len_prefix::<1>("SHORT_BINBYTES")?,
                        _ => self.len_prefix::<8>("BINBYTES8")?,
                    };
                    let bytes = self.take(n, "bytes")?.to_vec();
                    self.push(Node::Leaf(Value::Bytes(bytes)));
                }
                0x97 => {
                    return Err(self.refuse(
                        "NEXT_BUFFER",
                        at,
                        "out-of-band buffers are not available",
                    ))
                }
                0x98 => {
                    self.top(at)?;
                }
                b')' => self.push(Node::Tuple(Vec::new())),
                b't' => {
                    let items = self.pop_mark(at)?;
                    self.push(Node::Tuple(items));
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop(at)?);
                    }
                    items.reverse();
                    self.push(Node::Tuple(items));
                }
                b']' => self.push(Node::List(Vec::new())),
                b'l' => {
                    let items = self.pop_mark(at)?;
                    self.push(Node::List(items));
                }
                b'}' => self.push(Node::Dict(Vec::new(), HashMap::new())),
                b'd' => {
                    let items = self.pop_mark(at)?;
                    let id = self.push_node(Node::Dict(Vec::new(), HashMap::new()));
                    self.set_items(id, items, at)?;
                    self.stack.push(id);
                }
                0x8f => self.push(Node::Set(Vec::new())),
                0x91 => {
                    let items = self.pop_mark(at)?;
                    self.push(Node::Set(items));
                }
                b'a' => {
                    let v = self.pop(at)?;
                    let list = self.top(at)?;
                    self.append(list, vec![v], at)?;
                }
                b'e' => {
                    let items = self.pop_mark(at)?;
                    let list = self.top(at)?;
                    self.append(list, items, at)?;
                }
                b's' => {
                    let v = self.pop(at)?;
                    let k = self.pop(at)?;
                    let dict = self.top(at)?;
                    self.set_items(dict, vec![k, v], at)?;
                }
                b'u' => {
                    let items = self.pop_mark(at)?;
                    let dict = self.top(at)?;
                    self.set_items(dict, items, at)?;
                }
                0x90 => {
                    let items = self.pop_mark(at)?;
                    let set = self.top(at)?;
                    match self.node_mut(set, at)? {
                        Node::Set(s) => s.extend(items),
                        _ => {
                            return Err(
                                self.malformed(at, "ADDITEMS to something that is not a set")
                            )
                        }
                    }
                }
                b'g' => {
                    let s = self.line_str("GET")?;
                    let idx = s
                        .trim()
                        .parse()
                        .map_err(|_| self.malformed(at, "bad GET index"))?;
                    self.memo_get(idx, at)?;
                }
                b'h' => {
                    let idx = self.arr::<1>("BINGET")?[0];
                    self.memo_get(u32::from(idx), at)?;
                }
                b'j' => {
                    let idx = u32::from_le_bytes(self.arr("LONG_BINGET")?);
                    self.memo_get(idx, at)?;
                }
                b'p' => {
                    let s = self.line_str("PUT")?;
                    let idx = s
                        .trim()
                        .parse()
                        .map_err(|_| self.malformed(at, "bad PUT index"))?;
                    self.memo_put(idx, at)?;
                }
                b'q' => {
                    let idx = self.arr::<1>("BINPUT")?[0];
                    self.memo_put(u32::from(idx), at)?;
                }
                b'r' => {
                    let idx = u32::from_le_bytes(self.arr("LONG_BINPUT")?);
                    self.memo_put(idx, at)?;
                }
                0x94 => {
                    let idx = u32::try_from(self.memo.len())
                        .map_err(|_| self.malformed(at, "memo overflow"))?;
                    self.memo_put(idx, at)?;
                }
                b'c' => {
                    let module = self.line_str("GLOBAL module")?;
                    let name = self.line_str("GLOBAL name")?;
                    self.push_global(module, name)?;
                }
                0x93 => {
                    let name = self.pop(at)?;
                    let module = self.pop(at)?;
                    let (Some(Node::Leaf(Value::Str(m))), Some(Node::Leaf(Value::Str(n)))) =
                        (self.nodes.get(module), self.nodes.get(name))
                    else {
                        return Err(self.malformed(at, "STACK_GLOBAL needs two strings"));
                    };
                    let (m, n) = (m.clone(), n.clone());
                    self.push_global(&m, &n)?;
                }
                0x82..=0x84 => {
                    return Err(self.refuse("EXT", at, "the extension registry is empty in hspack"))
                }
                b'P' => {
                    return Err(self.refuse(
                        "PERSID",
                        at,
                        "torch writes binary persistent ids only",
                    ))
                }
                b'Q' => {
                    let pid = self.pop(at)?;
                    let pid = self.expand(pid, 0)?;
                    let storage = calls::persistent_load(self, pid, at)?;
                    if self.loaded_keys.insert(storage.key.clone()) {
                        self.loaded.push(storage.clone());
                    }
                    self.push(Node::Leaf(Value::Storage(storage)));
                }
                b'i' => {
                    let module = self.line_str("INST module")?;
                    let name = self.line_str("INST name")?;
                    let allowed = self.check_global(module, name)?;
                    let args = self.pop_mark(at)?;
                    let id = calls::call(self, allowed, args, at)?;
                    self.stack.push(id);
                }
                b'o' => {
                    let mut args = self.pop_mark(at)?;
                    if args.is_empty() {
                        return Err(self.malformed(at, "OBJ without a class"));
                    }
                    let class = args.remove(0);
                    let allowed = self.callable(class, at)?;
                    let id = calls::call(self, allowed, args, at)?;
                    self.stack.push(id);
                }
                b'R' | 0x81 | 0x92 => {
                    if op == 0x92 {
                        let kwargs = self.pop(at)?;
                        match self.nodes.get(kwargs) {
                            Some(Node::Dict(items, _)) if items.is_empty() => {}
                            _ => return Err(self.malformed(at, "NEWOBJ_EX with keyword arguments")),
                        }
                    }
                    let args = self.pop(at)?;
                    let callable = self.pop(at)?;
                    let args = match self.nodes.get(args) {
                        Some(Node::Tuple(items)) => items.clone(),
                        _ => return Err(self.malformed(at, "call arguments are not a tuple")),
                    };
                    // Arguments are copied per call; a memoised tuple reused as arguments
                    // must not make the work quadratic in the input.
                    self.charge(args.len() as u64 * 8)?;
                    let allowed = self.callable(callable, at)?;
                    let id = calls::call(self, allowed, args, at)?;
                    self.stack.push(id);
                }
                b'b' => {
                    let state = self.pop(at)?;
                    let target = self.top(at)?;
                    calls::build(self, target, state, at)?;
                }
                _ => return Err(self.malformed(at, format!("unknown opcode 0x{op:02x}"))),
            }
        }
    }

    /// The allowed callable a node refers to.
    fn callable(&self, id: Id, at: usize) -> Result<Allowed, ConvertError> {
        match self.nodes.get(id) {
            Some(Node::Leaf(Value::Global { module, name })) => self.check_global(module, name),
            _ => Err(self.malformed(at, "calling something that is not a global")),
        }
    }

    /// Replaces a node in place (used by `BUILD`).
    pub(super) fn replace(&mut self, id: Id, node: Node, at: usize) -> Result<(), ConvertError> {
        *self.node_mut(id, at)? = node;
        Ok(())
    }
}

fn leaf_cost(v: &Value) -> u64 {
    match v {
        Value::Str(s) => s.len() as u64,
        Value::Bytes(b) | Value::BigInt(b) => b.len() as u64,
        Value::NdArray(a) => a.data.len() as u64,
        _ => 32,
    }
}
