//! The function libraries on the server holding the pool: listing and
//! loading them, and reading the refusals that turn the runner to
//! `EVALSHA`.

use redis::RedisError;

use super::connection::ScriptConnection;
use super::scripts;

/// Loads the function libraries on the server holding the pool: the
/// private one (its failure is the caller's), then the public one, whose
/// failure is logged and goes no further: the public library serves other
/// programs, never this one's calls.
pub(super) async fn load_library(conn: &mut impl ScriptConnection) -> Result<(), RedisError> {
    load(conn, &scripts::LIBRARY).await?;
    if let Err(e) = load(conn, &scripts::PUBLIC_LIBRARY).await {
        public_library_not_loaded(&e);
    }
    Ok(())
}

/// Loads the public library where `FUNCTION LIST` lacks it; a failure is
/// logged only (see [`load_library`]).
pub(super) async fn load_public_library_if_missing(conn: &mut impl ScriptConnection) {
    let loaded = match library_listed(conn, &scripts::PUBLIC_LIBRARY).await {
        Ok(true) => Ok(()),
        Ok(false) => load(conn, &scripts::PUBLIC_LIBRARY).await,
        Err(e) => Err(e),
    };
    if let Err(e) = loaded {
        public_library_not_loaded(&e);
    }
}

/// Whether `FUNCTION LIST` shows `library`.
pub(super) async fn library_listed(
    conn: &mut impl ScriptConnection,
    library: &scripts::Library,
) -> Result<bool, RedisError> {
    let listed: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(&library.name)
        .query_async(conn)
        .await?;
    Ok(matches!(listed, redis::Value::Array(libraries) if !libraries.is_empty()))
}

/// `FUNCTION LOAD REPLACE` of `library` on the server holding the pool.
pub(super) async fn load(
    conn: &mut impl ScriptConnection,
    library: &scripts::Library,
) -> Result<(), RedisError> {
    let reply = conn.send_to_pool_node(&library.load_cmd()).await?;
    reply.extract_error().map(drop)
}

/// A library load that failed for another reason than a refusal of
/// Functions: logged; the caller goes on by `EVALSHA`.
pub(super) fn library_not_loaded(e: &RedisError) {
    tracing::warn!(
        code = e.code().unwrap_or(""),
        kind = ?e.kind(),
        library = scripts::LIBRARY.name.as_str(),
        "the function library could not be loaded: running the script by EVALSHA"
    );
}

/// The public library could not be loaded: logged (the code and kind of
/// the error, never its text, which may quote what was sent), and this
/// deployment goes on with its private library.
pub(super) fn public_library_not_loaded(e: &RedisError) {
    tracing::warn!(
        code = e.code().unwrap_or(""),
        kind = ?e.kind(),
        library = scripts::PUBLIC_LIBRARY.name.as_str(),
        "the public contract library could not be loaded: other programs cannot call it yet"
    );
}

/// `FCALL` named a function this server does not have.
pub(super) fn function_missing(e: &RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// The server will not run or load functions at all: `FCALL` or `FUNCTION`
/// unknown (renamed away, an older or restricted service) or denied by an
/// ACL. Each of these refusals proves the call did not run.
pub(super) fn functions_refused(e: &RedisError) -> bool {
    match e.code() {
        Some("NOPERM") => true,
        Some("ERR") => e.detail().is_some_and(|d| {
            d.starts_with("unknown command") || d.starts_with("unknown subcommand")
        }),
        _ => false,
    }
}
