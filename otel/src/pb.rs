//! The few protobuf wire rules the OTLP encoder needs. The request is written straight from
//! the snapshot into one buffer: prost's message structs would cost an allocation per
//! attribute string and a second walk for the lengths, per data point, every export.
//! Fields are written in field-number order and proto3 defaults are left out, as prost
//! does, so the bytes are canonical (a test re-encodes them with prost and compares).

pub const VARINT: u8 = 0;
pub const FIXED64: u8 = 1;
pub const LEN: u8 = 2;

/// The key of a field number below 16: one byte.
pub const fn key(field: u8, wire: u8) -> u8 {
    debug_assert!(field < 16);
    (field << 3) | wire
}

pub fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub const fn varint_len(v: u64) -> usize {
    // 1 byte per 7 bits, at least one: ceil(bits / 7) as a multiply and a shift (prost's
    // form), not a division, since it is asked for every length of every request.
    ((((v | 1).leading_zeros() ^ 63) * 9 + 73) / 64) as usize
}

/// The encoded size of a length-delimited field whose body is `len` bytes.
pub const fn len_field(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// A length-delimited field's key and length; the body follows.
pub fn len_header(out: &mut Vec<u8>, field: u8, len: usize) {
    out.push(key(field, LEN));
    varint(out, len as u64);
}

pub fn bytes(out: &mut Vec<u8>, field: u8, b: &[u8]) {
    len_header(out, field, b.len());
    out.extend_from_slice(b);
}

/// A string field, left out when empty (proto3's default).
pub fn string(out: &mut Vec<u8>, field: u8, s: &str) {
    if !s.is_empty() {
        bytes(out, field, s.as_bytes());
    }
}

pub fn string_len(s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        len_field(s.len())
    }
}

pub fn fixed64(out: &mut Vec<u8>, field: u8, v: u64) {
    out.push(key(field, FIXED64));
    out.extend_from_slice(&v.to_le_bytes());
}

/// An attribute value: the `AnyValue` kinds the agent sends.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    Str(&'a str),
    Int(i64),
}

fn any_value_len(v: Value) -> usize {
    match v {
        // A oneof member is written even when it holds its default.
        Value::Str(s) => len_field(s.len()),
        Value::Int(i) => 1 + varint_len(i as u64),
    }
}

/// A `KeyValue` as field `field` of its parent (resource: 1, data point: 7).
pub fn key_value(out: &mut Vec<u8>, field: u8, k: &str, v: Value) {
    let any = any_value_len(v);
    len_header(out, field, string_len(k) + len_field(any));
    string(out, 1, k);
    len_header(out, 2, any);
    match v {
        Value::Str(s) => bytes(out, 1, s.as_bytes()),
        Value::Int(i) => {
            out.push(key(3, VARINT));
            varint(out, i as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    use prost::Message;

    use super::*;

    #[test]
    fn varint_lengths_match_the_encoding() {
        for v in [
            0,
            1,
            127,
            128,
            16383,
            16384,
            u32::MAX as u64,
            u64::MAX,
            -1i64 as u64,
        ]
        .into_iter()
        // Each width's edges: 2^k - 1 and 2^k.
        .chain((1..64).flat_map(|k| [(1u64 << k) - 1, 1u64 << k]))
        {
            let mut out = vec![];
            varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
            assert_eq!(prost::encoding::encoded_len_varint(v), out.len(), "{v}");
        }
    }

    #[test]
    fn key_values_are_what_prost_writes() {
        for (k, v) in [
            ("hw.id", Value::Str("GPU-1")),
            ("gpu.index", Value::Int(7)),
            ("x", Value::Int(-3)),
            ("empty", Value::Str("")),
            ("long", Value::Str(&"a".repeat(300))),
        ] {
            let kv = KeyValue {
                key: k.into(),
                value: Some(AnyValue {
                    value: Some(match v {
                        Value::Str(s) => any_value::Value::StringValue(s.into()),
                        Value::Int(i) => any_value::Value::IntValue(i),
                    }),
                }),
                ..Default::default()
            };
            let mut want = vec![];
            prost::encoding::message::encode(7, &kv, &mut want);
            let mut got = vec![];
            key_value(&mut got, 7, k, v);
            assert_eq!(got, want, "{k}");
            assert_eq!(
                kv.encoded_len(),
                got.len() - 1 - varint_len(kv.encoded_len() as u64)
            );
        }
    }
}
