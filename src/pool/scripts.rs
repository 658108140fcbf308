//! The pool's Lua scripts (`lua/`). Each is loaded with `lua/prelude.lua`
//! joined in after its `#!lua` line, so the key names, the clock, the record
//! rules and the index writes have one definition.

use std::sync::LazyLock;

use redis::{Script, ScriptInvocation};

use super::keys;
use super::policy::PoolPolicy;

const PRELUDE: &str = include_str!("../../lua/prelude.lua");

/// `body` with the prelude joined in after its first (shebang) line.
fn with_prelude(body: &str) -> String {
    let (shebang, rest) = body.split_once('\n').unwrap_or((body, ""));
    format!("{shebang}\n{PRELUDE}\n{rest}")
}

fn compose(body: &str) -> Script {
    Script::new(&with_prelude(body))
}

/// `lua/extract.lua`.
pub(super) static EXTRACT: LazyLock<Script> =
    LazyLock::new(|| compose(include_str!("../../lua/extract.lua")));
/// `lua/upsert.lua`.
pub(super) static UPSERT: LazyLock<Script> =
    LazyLock::new(|| compose(include_str!("../../lua/upsert.lua")));
/// `lua/contract.lua`.
pub(super) static CONTRACT: LazyLock<Script> =
    LazyLock::new(|| compose(include_str!("../../lua/contract.lua")));
/// `lua/prune.lua`.
pub(super) static PRUNE: LazyLock<Script> =
    LazyLock::new(|| compose(include_str!("../../lua/prune.lua")));
/// `lua/inventory.lua`.
pub(super) static INVENTORY: LazyLock<Script> =
    LazyLock::new(|| compose(include_str!("../../lua/inventory.lua")));
/// `lua/ratelimit.lua` (not a pool-index script: no prelude).
pub(super) static RATELIMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/ratelimit.lua")));

/// `lua/usage_backlog.lua` (read only, no pool keys: no prelude).
pub(super) static USAGE_BACKLOG: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/usage_backlog.lua")));
/// `lua/client_lookup.lua` (the Redis client registry: no prelude).
pub(super) static CLIENT_LOOKUP: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/client_lookup.lua")));
/// `lua/client_put.lua`.
pub(super) static CLIENT_PUT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/client_put.lua")));
/// `lua/client_revoke.lua`.
pub(super) static CLIENT_REVOKE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/client_revoke.lua")));

/// The SHA-1 `EVALSHA` names `lua/extract.lua` by (as loaded, prelude
/// joined in), so a reader of `SLOWLOG` or `MONITOR` can tell its calls
/// from the other scripts'.
pub fn extract_hash() -> &'static str {
    EXTRACT.get_hash()
}

/// An invocation of a pool script with the pool keys declared and the
/// caller's pool policy as its first argument.
pub(super) fn with_pool_keys<'a>(script: &'a Script, policy: &PoolPolicy) -> ScriptInvocation<'a> {
    let mut inv = script.prepare_invoke();
    for key in keys::POOL {
        inv.key(key);
    }
    inv.arg(policy.script_arg());
    inv
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shebang stays the first line (Redis reads flags only there) and
    /// every pool script sees the prelude.
    #[test]
    fn prelude_joins_after_the_shebang() {
        for body in [
            include_str!("../../lua/extract.lua"),
            include_str!("../../lua/upsert.lua"),
            include_str!("../../lua/contract.lua"),
            include_str!("../../lua/prune.lua"),
            include_str!("../../lua/inventory.lua"),
        ] {
            let code = with_prelude(body);
            assert!(code.starts_with("#!lua"), "{}", &code[..20]);
            assert_eq!(code.lines().next(), body.lines().next());
            assert!(code.contains("local function well_formed"));
        }
    }
}
