//! How large a request head may be: the bound the handler checks on every
//! request, the bounds `serve`'s HTTP/1.1 parser applies, and why that
//! parser refused a head.

/// Largest total size of request header names and values.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Most header fields `serve` reads in one request head.
pub const MAX_HEADER_FIELDS: usize = 100;
/// Largest request head (request line and header lines) `serve` reads:
/// below the longest URI its HTTP/1.1 parser takes (65,534 bytes), so a
/// head too long is always this 431, never a 414.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Why `serve`'s HTTP/1.1 parser refused a request head, before any
/// handler ran (its problem: [`refused_head`](super::refused_head)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedHead {
    /// More than [`MAX_HEADER_FIELDS`] header fields, or more than
    /// [`MAX_HEAD_BYTES`] (431).
    TooLarge,
    /// A request line or header line that is not HTTP/1.1 (400).
    Malformed,
}
