//! Form and query components: decoding what browsers send, encoding what links and redirects carry.

/// A form or query component decoded: `+` is a space (HTML forms), then
/// percent escapes; invalid UTF-8 becomes U+FFFD rather than an error.
pub(crate) fn urldecode(text: &str) -> String {
    let spaced = text.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8_lossy()
        .into_owned()
}

/// Everything but RFC 3986 unreserved characters and `/` is escaped (the
/// slash is kept so a `next` path stays readable in the address bar).
const URL_COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

/// Percent-encodes everything but unreserved characters.
pub(crate) fn urlencode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, URL_COMPONENT).to_string()
}
