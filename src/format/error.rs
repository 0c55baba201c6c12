//! Errors found while decoding bytes. They carry no file context; the layers above add it.

/// A structure's bytes do not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The bytes are too short for the structure.
    #[error("{structure} is truncated: needs {needed} bytes, has {available}; the file was cut short (incomplete copy?): copy it again")]
    Truncated {
        /// Which structure.
        structure: &'static str,
        /// Bytes needed.
        needed: u64,
        /// Bytes available.
        available: u64,
    },
    /// The magic bytes are wrong.
    #[error("{structure} has magic {found:02x?}, expected {expected:?}: this is not an hspack {structure}, or it is damaged")]
    BadMagic {
        /// Which structure.
        structure: &'static str,
        /// The bytes found.
        found: [u8; 8],
        /// The magic expected.
        expected: &'static str,
    },
    /// The structure was written by a format version this reader does not know.
    #[error("{structure} has format version {found}; this hspack reads versions {min}..={max}: upgrade hspack to read it")]
    UnsupportedVersion {
        /// Which structure.
        structure: &'static str,
        /// Version found.
        found: u64,
        /// Lowest version read.
        min: u64,
        /// Highest version read.
        max: u64,
    },
    /// The structure's own check value does not match its bytes.
    #[error("{structure} fails its check value (stored {stored:016x}, computed {computed:016x}): the bytes are damaged")]
    CheckMismatch {
        /// Which structure.
        structure: &'static str,
        /// Check value stored.
        stored: u64,
        /// Check value computed.
        computed: u64,
    },
    /// A field holds a value outside what the format allows.
    #[error("{structure}: {what} is {value}, but must be {rule}: the bytes are damaged or were not written by hspack")]
    Invalid {
        /// Which structure.
        structure: &'static str,
        /// Which value.
        what: &'static str,
        /// The value found.
        value: u64,
        /// What the value must satisfy.
        rule: String,
    },
    /// A reserved byte is not zero.
    #[error("{structure}: reserved bytes at offset {offset} are not zero: the bytes are damaged")]
    ReservedNotZero {
        /// Which structure.
        structure: &'static str,
        /// Offset of the first non-zero reserved byte within the structure.
        offset: usize,
    },
    /// Text that must be JSON is not, or does not match the expected shape.
    #[error("{structure} is not valid: {detail}")]
    Json {
        /// Which structure.
        structure: &'static str,
        /// What the parser said.
        detail: String,
    },
}
