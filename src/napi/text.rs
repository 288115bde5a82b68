//! A JavaScript string taken into Rust as UTF-8 in one pass where it is ASCII.
//!
//! napi-rs's `String` asks V8 for the string's UTF-8 length (a pass over the whole string), then
//! zero-fills a buffer of that length and has V8 write into it: three passes over a long string on
//! JavaScript's thread. Most long strings an append carries are ASCII, whose UTF-8 length is their
//! length in UTF-16 units, which V8 knows without a pass. So the buffer is sized by that, left
//! unfilled, and written once; the write is whole when it filled the buffer with ASCII bytes. Only
//! a string with other characters takes a second write, into a buffer that fits any string of its
//! length (three bytes per unit).

use napi::bindgen_prelude::{FromNapiValue, TypeName, ValidateNapiValue, ValueType};
use napi::{sys, Status};

/// A string argument, as UTF-8.
pub struct Text(pub String);

/// Strings longer than this (in UTF-16 units) are written with V8's own measure of their UTF-8
/// length, as napi-rs does: a string that is not ASCII holds a buffer of three bytes per unit,
/// 48 MiB at this length, however much of it the string needs.
const SIZED_BY_UNITS_MAX: usize = 16 * 1024 * 1024;

impl Text {
    /// Write the string at `value` into a new buffer with room for `capacity` bytes (and the
    /// terminator N-API adds); the bytes written.
    ///
    /// SAFETY: `env` and `value` are the current call's, and `value` is a string.
    unsafe fn write(env: sys::napi_env, value: sys::napi_value, capacity: usize) -> napi::Result<Vec<u8>> {
        let mut buf: Vec<u8> = Vec::with_capacity(capacity + 1);
        let mut written = 0;
        // SAFETY: N-API writes at most `capacity + 1` bytes (the terminator included) into the
        // buffer, which has room for them, and says how many it wrote before the terminator.
        let status =
            unsafe { sys::napi_get_value_string_utf8(env, value, buf.as_mut_ptr().cast(), capacity + 1, &mut written) };
        check(status, "writing a string as UTF-8")?;
        // SAFETY: the first `written` bytes were written just now (`written <= capacity`).
        unsafe { buf.set_len(written.min(capacity)) };
        Ok(buf)
    }
}

fn check(status: sys::napi_status, doing: &str) -> napi::Result<()> {
    if status == sys::Status::napi_ok {
        Ok(())
    } else {
        Err(napi::Error::new(Status::from(status), format!("{doing} failed")))
    }
}

impl FromNapiValue for Text {
    unsafe fn from_napi_value(env: sys::napi_env, value: sys::napi_value) -> napi::Result<Self> {
        let mut units = 0;
        // The length in UTF-16 units, which V8 keeps; fails unless `value` is a string.
        let status = unsafe { sys::napi_get_value_string_utf16(env, value, std::ptr::null_mut(), 0, &mut units) };
        if status == sys::Status::napi_string_expected {
            return Err(napi::Error::new(
                Status::StringExpected,
                "expected a string".to_string(),
            ));
        }
        check(status, "reading a string's length")?;
        if units > SIZED_BY_UNITS_MAX {
            return unsafe { String::from_napi_value(env, value) }.map(Text);
        }
        // SAFETY: `value` is a string of this call.
        let ascii = unsafe { Text::write(env, value, units) }?;
        // Whole: `units` ASCII bytes are `units` characters of one unit each, all of them.
        let bytes = if ascii.len() == units && ascii.is_ascii() {
            ascii
        } else {
            drop(ascii);
            // SAFETY: as above; no string needs more than three bytes of UTF-8 per UTF-16 unit.
            unsafe { Text::write(env, value, units * 3) }?
        };
        // SAFETY: V8 writes UTF-8, replacing what it cannot encode (a lone surrogate) with U+FFFD,
        // and stops only at a character's end.
        Ok(Text(unsafe { String::from_utf8_unchecked(bytes) }))
    }
}

impl TypeName for Text {
    fn type_name() -> &'static str {
        "String"
    }

    fn value_type() -> ValueType {
        ValueType::String
    }
}

impl ValidateNapiValue for Text {}
