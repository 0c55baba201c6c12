//! Decoding of the textual arguments of protocol-0 opcodes and of long integers.

use super::value::Value;

/// Longest decimal integer accepted (Python's own default limit for `int(str)`).
const MAX_DIGITS: usize = 4300;

/// A decimal integer, as `Int` when it fits in 64 bits, else as `BigInt`.
pub(super) fn parse_int(s: &str) -> Option<Value> {
    let s = s.trim();
    if let Ok(v) = s.parse::<i64>() {
        return Some(Value::Int(v));
    }
    let (negative, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if digits.is_empty() || digits.len() > MAX_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    // Little-endian magnitude, base 256.
    let mut mag: Vec<u8> = Vec::new();
    for d in digits.bytes() {
        let mut carry = u32::from(d - b'0');
        for byte in mag.iter_mut() {
            let v = u32::from(*byte) * 10 + carry;
            *byte = (v & 0xff) as u8;
            carry = v >> 8;
        }
        while carry > 0 {
            mag.push((carry & 0xff) as u8);
            carry >>= 8;
        }
    }
    // Room for the sign bit.
    mag.push(0);
    if negative {
        let mut carry = 1u16;
        for byte in mag.iter_mut() {
            let v = u16::from(!*byte) + carry;
            *byte = (v & 0xff) as u8;
            carry = v >> 8;
        }
    }
    Some(long_from_le(&mag))
}

/// A little-endian two's-complement integer (`LONG1`/`LONG4`), as `Int` when it fits.
pub(super) fn long_from_le(bytes: &[u8]) -> Value {
    let Some(&last) = bytes.last() else {
        return Value::Int(0);
    };
    let fill = if last & 0x80 != 0 { 0xff } else { 0 };
    // Strip redundant sign bytes.
    let mut len = bytes.len();
    while len > 1 {
        let (Some(&b), Some(&prev)) = (bytes.get(len - 1), bytes.get(len - 2)) else {
            break;
        };
        if b == fill && (prev & 0x80) == (fill & 0x80) {
            len -= 1;
        } else {
            break;
        }
    }
    let bytes = bytes.get(..len).unwrap_or(bytes);
    if bytes.len() <= 8 {
        let mut wide = [fill; 8];
        for (dst, src) in wide.iter_mut().zip(bytes) {
            *dst = *src;
        }
        Value::Int(i64::from_le_bytes(wide))
    } else {
        Value::BigInt(bytes.to_vec())
    }
}

/// A `str` when the bytes are UTF-8, else `bytes`.
pub(super) fn str_or_bytes(bytes: Vec<u8>) -> Value {
    match String::from_utf8(bytes) {
        Ok(s) => Value::Str(s),
        Err(e) => Value::Bytes(e.into_bytes()),
    }
}

/// The bytes of a Python 2 `repr` string literal (`'abc\n'`), as written by `STRING`.
pub(super) fn unquote(line: &[u8]) -> Option<Vec<u8>> {
    let (&q, rest) = line.split_first()?;
    if q != b'\'' && q != b'"' {
        return None;
    }
    let (&end, body) = rest.split_last()?;
    if end != q {
        return None;
    }
    let mut out = Vec::with_capacity(body.len());
    let mut it = body.iter().copied();
    while let Some(b) = it.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match it.next()? {
            b'\\' => out.push(b'\\'),
            b'\'' => out.push(b'\''),
            b'"' => out.push(b'"'),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'v' => out.push(11),
            b'x' => {
                let hi = hex(it.next()?)?;
                let lo = hex(it.next()?)?;
                out.push(hi * 16 + lo);
            }
            d @ b'0'..=b'7' => {
                let mut v = u32::from(d - b'0');
                let mut peek = it.clone();
                for _ in 0..2 {
                    match peek.next() {
                        Some(n @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(n - b'0');
                            it.next();
                        }
                        _ => break,
                    }
                }
                out.push(u8::try_from(v & 0xff).ok()?);
            }
            _ => return None,
        }
    }
    Some(out)
}

/// Python's `raw-unicode-escape` decoding, as written by `UNICODE`.
pub(super) fn raw_unicode_escape(line: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while let Some(&b) = line.get(i) {
        if b == b'\\' {
            let width = match line.get(i + 1) {
                Some(b'u') => Some(4),
                Some(b'U') => Some(8),
                _ => None,
            };
            if let Some(width) = width {
                let digits = line.get(i + 2..i + 2 + width)?;
                let mut v = 0u32;
                for &d in digits {
                    v = v.checked_mul(16)?.checked_add(u32::from(hex(d)?))?;
                }
                out.push(char::from_u32(v)?);
                i += 2 + width;
                continue;
            }
        }
        out.push(char::from(b));
        i += 1;
    }
    Some(out)
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longs() {
        assert_eq!(long_from_le(&[]), Value::Int(0));
        assert_eq!(long_from_le(&[0xff]), Value::Int(-1));
        assert_eq!(long_from_le(&[0x00, 0x80, 0x00]), Value::Int(0x8000));
        assert_eq!(
            long_from_le(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
            Value::Int(-1)
        );
        let magic = [0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19];
        assert_eq!(long_from_le(&magic), Value::BigInt(magic.to_vec()));
        assert_eq!(
            parse_int("119547037146038801333356"),
            Some(Value::BigInt(magic.to_vec()))
        );
        assert_eq!(parse_int("-5"), Some(Value::Int(-5)));
        assert_eq!(
            parse_int("-9223372036854775809"),
            Some(Value::BigInt(vec![
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff
            ]))
        );
        assert_eq!(parse_int("12a"), None);
    }

    #[test]
    fn text_literals() {
        assert_eq!(unquote(b"'a\\n\\x41\\101\\''"), Some(b"a\nAA'".to_vec()));
        assert_eq!(unquote(b"'open"), None);
        assert_eq!(
            raw_unicode_escape(b"caf\\u00e9 \\U0001F600"),
            Some("café 😀".into())
        );
        assert_eq!(raw_unicode_escape(b"\\u12"), None);
    }
}
